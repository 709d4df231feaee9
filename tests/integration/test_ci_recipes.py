"""The CI recipes of docs/ci: the GitHub Actions workflow passes actionlint (installed by the
test extra; a broken copy of the workflow fails it, so the lint can fail) and runs what the
README says; the plain shell recipe parses, and run here passes ninelives's exit codes on
and names the JUnit file: a sharded soak merged (0), a broken engine (1), a shard missing
at the merge (2), and the smoke campaign of real processes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "docs" / "ci" / "github-actions.yml"
RECIPE = ROOT / "docs" / "ci" / "other-ci.sh"
BIN = Path(sys.executable).parent


def actionlint() -> str:
    found = shutil.which("actionlint", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    assert found, "actionlint is missing: the test extra installs it (pip install -e '.[test]')"
    return found


def lint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([actionlint(), "-no-color", str(path)], capture_output=True,
                          text=True, timeout=120, cwd=path.parent)


def test_the_workflow_passes_actionlint():
    linted = lint(WORKFLOW)
    assert (linted.returncode, linted.stdout + linted.stderr) == (0, "")


def test_actionlint_reports_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text(WORKFLOW.read_text().replace("matrix.shard }}/", "matrix.shrad }}/"))
    linted = lint(broken)
    assert linted.returncode != 0 and "shrad" in linted.stdout


def test_the_workflow_runs_smoke_on_push_and_a_sharded_soak_nightly_then_merges():
    flow = yaml.safe_load(WORKFLOW.read_text())
    triggers = flow[True]  # YAML 1.1 reads the key `on` as true
    assert {"push", "schedule"} <= set(triggers) and triggers["schedule"][0]["cron"]
    jobs = flow["jobs"]
    smoke, soak, merge = jobs["smoke"], jobs["soak"], jobs["merge"]
    runs = lambda job: "\n".join(s.get("run", "") for s in job["steps"])  # noqa: E731
    uses = lambda job: [s.get("uses", "").split("@")[0] for s in job["steps"]]  # noqa: E731
    assert "push" in smoke["if"] and "ninelives run smoke --seeds 1" in runs(smoke)
    assert "schedule" in soak["if"] and soak["strategy"]["matrix"]["shard"] == [1, 2, 3, 4]
    assert soak["env"]["SHARD"] == "${{ matrix.shard }}/${{ strategy.job-total }}"
    assert '--shard "$SHARD"' in runs(soak) and "ninelives sim" in runs(soak)
    assert merge["needs"] == "soak" and "actions/download-artifact" in uses(merge)
    assert "ninelives merge shards/* --out ci-reports/soak" in runs(merge)
    for job in (smoke, soak, merge):
        assert "actions/upload-artifact" in uses(job)
        assert '>> "$GITHUB_STEP_SUMMARY"' in runs(job)
    for job in (smoke, merge):
        assert "ninelives annotate ci-reports/" in runs(job)


def recipe(tmp_path: Path, *argv: str, **env: str) -> subprocess.CompletedProcess:
    settings = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                "OUT": str(tmp_path / "ci-reports"), "PROFILE": "smoke", **env}
    return subprocess.run(["bash", str(RECIPE), *argv], capture_output=True, text=True,
                          timeout=240, cwd=tmp_path, env=settings)


def test_the_shell_recipe_parses():
    checked = subprocess.run(["bash", "-n", str(RECIPE)], capture_output=True, text=True)
    assert (checked.returncode, checked.stderr) == (0, "")


def test_the_shell_recipe_passes_the_exit_codes_on_and_names_the_junit_file(tmp_path):
    out = tmp_path / "ci-reports"
    for i in (1, 2):
        done = recipe(tmp_path, "soak", SCENARIO="smoke", SEEDS="1..4", SHARD=f"{i}/2")
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.splitlines()[-1].startswith("ninelives soak: exit 0, pass")
    done = recipe(tmp_path, "merge", str(out / "shard-1"), str(out / "shard-2"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"JUnit: {out / 'soak' / 'junit.xml'}" in done.stdout.splitlines()[-1]
    invariants = json.loads((out / "soak" / "campaign.json").read_text())["invariants"]
    assert f'tests="{len(invariants)}" failures="0"' in (out / "soak" / "junit.xml").read_text()
    missing = recipe(tmp_path / "ci-reports", "merge", str(out / "shard-1"))
    assert missing.returncode == 2 and "shard 2 of 2 is missing" in missing.stderr
    broken = recipe(tmp_path, "soak", SCENARIO=str(ROOT / "scenarios/mutants/memo-hits.toml"),
                    SEEDS="1..2", SHARD="2/2", ENGINE="chaos.mutants:memo_check_skipped",
                    OUT=str(tmp_path / "broken"))
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "exit 1, FAIL: an invariant failed; JUnit: " in broken.stdout
    assert "<failure" in (tmp_path / "broken" / "shard-2" / "junit.xml").read_text()
    assert recipe(tmp_path, "nonsense").returncode == 2


def test_the_shell_recipe_runs_the_smoke_campaign_of_real_processes(tmp_path):
    done = recipe(tmp_path, "smoke", SEEDS="1")
    assert done.returncode == 0, done.stdout + done.stderr
    folder = tmp_path / "ci-reports" / "smoke"
    assert f"JUnit: {folder / 'junit.xml'}" in done.stdout.splitlines()[-1]
    assert (folder / "campaign.json").exists() and (folder / "smoke" / "latest").exists()


def test_the_readme_shows_the_workflow_as_it_is_and_links_both_recipes():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## In CI", 1)[1].split("\n## ", 1)[0]
    assert "(docs/ci/github-actions.yml)" in section and "(docs/ci/other-ci.sh)" in section
    excerpt = section.split("```yaml", 1)[1].split("```", 1)[0]
    workflow = WORKFLOW.read_text()
    shown = [line.split("#")[0].strip() for line in excerpt.splitlines()]
    shown = [line.replace("- run: ", "run: ") for line in shown
             if line and line not in ("- run: >-", "- run: |")]
    assert len(shown) > 10 and "run: ninelives merge shards/* --out ci-reports/soak" in shown
    for line in shown:  # every line of the excerpt is a line of the file (comments aside)
        assert any(line == w.strip() for w in workflow.splitlines()), line
    for path in ("ci-reports/smoke/junit.xml", "ci-reports/soak/junit.xml"):
        assert path in section
