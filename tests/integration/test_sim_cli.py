"""`ninelives sim` as a user runs it: exploring seeds, one seed's run folder (the same files as
a real run, which `ninelives check` and `--replay` agree with), the same seed in two processes
writing the same history, a broken engine shrunk to a counterexample that replays, and bad
input refused with one `error:` line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.checkers import INVARIANTS

#: A scenario file of zombies (leases expired under slow and hanging calls).
ZOMBIES_TOML = """
name = "cli-zombies"
[run]
jobs = 4
workers = 4
senders = 1
chaos = 3.0
heal = 0.5
drain = 20.0
[engine]
lease = 1.0
call_timeout = 1.0
heartbeat = true
heartbeat_interval = 0.2
max_attempts = 8
max_claims = 40
backoff_base = 0.05
backoff_cap = 0.2
[faults]
slow = 0.6
slow_seconds = 0.6
hang = 0.25
hang_seconds = 1.5
lease_expiry = 3.0
[expect]
duplicate_spend_allowance = 1.0
"""

#: Adapters for --engine: one broken in-process by its patch(), one that cannot be simulated.
ADAPTERS = '''
import dataclasses
from contextlib import contextmanager
from chaos.reference import ReferenceEngine
from engine.store import SQLiteStore


class Unfenced(ReferenceEngine):
    name = "unfenced-completion"

    @contextmanager
    def patch(self):
        original = SQLiteStore.__dict__["complete"]

        def complete(self, claim, pipeline, worker, now, **kwargs):
            token = self.conn.execute("SELECT lease_token FROM job WHERE id=?",
                                      (claim.job_id,)).fetchone()[0]
            return original(self, dataclasses.replace(claim, lease_token=token), pipeline,
                            worker, now, **kwargs)

        SQLiteStore.complete = complete
        try:
            yield
        finally:
            SQLiteStore.complete = original


class Elsewhere(ReferenceEngine):
    name = "elsewhere"


UNFENCED = Unfenced()
ELSEWHERE = Elsewhere()
'''


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "zombies.toml").write_text(ZOMBIES_TOML)
    (tmp_path / "sim_adapters.py").write_text(ADAPTERS)
    return tmp_path


def ninelives(workdir: Path, *args: str, timeout: float = 240.0) -> subprocess.CompletedProcess:
    """Run `ninelives ...` in `workdir` (which is on the import path, for --engine)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(workdir), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "chaos.commands.cli", *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=timeout)


def explain(ran: subprocess.CompletedProcess) -> str:
    return f"$ {' '.join(ran.args)}\nexit {ran.returncode}\n{ran.stdout}\n{ran.stderr}"


def run_folders(out: Path) -> list[Path]:
    return sorted(p.parent for p in out.rglob("report.json"))


def test_exploring_seeds_prints_a_summary_and_exits_0_when_every_invariant_holds(workdir):
    ran = ninelives(workdir, "sim", "smoke", "--profile", "smoke", "--seeds", "1..3", "--out",
                    "out", "--quiet")
    assert ran.returncode == 0, explain(ran)
    assert "3 schedules in" in ran.stdout and "no invariant failed" in ran.stdout
    # passing seeds of an exploration leave no run folder, only the campaign's record
    assert run_folders(workdir / "out") == []
    assert sorted(p.name for p in (workdir / "out").iterdir()) == [
        "campaign.json", "junit.xml", "report.html", "summary.md"]


def test_one_seed_writes_a_run_folder_that_check_and_replay_agree_with(workdir):
    ran = ninelives(workdir, "sim", "smoke", "--profile", "smoke", "--seed", "2", "--out",
                    "out")
    assert ran.returncode == 0, explain(ran)
    [folder] = run_folders(workdir / "out")
    for name in ("history.jsonl", "snapshot.json", "plan.json", "scenario.json",
                 "provider.jsonl", "receiver.jsonl", "engine.db", "schedule.json"):
        assert (folder / name).stat().st_size > 0, name
    report = json.loads((folder / "report.json").read_text())
    assert report["schema"] == "ninelives.report/1" and report["exit_code"] == 0
    assert [v["name"] for v in report["verdicts"]] == list(INVARIANTS)
    assert report["replay_command"].startswith("ninelives sim --replay")
    assert " --seed 2 " in report["run_command"]  # one seed: --seeds 2 is seeds 1..2
    checked = ninelives(workdir, "check", str(folder))
    assert checked.returncode == 0, explain(checked)
    replayed = ninelives(workdir, "sim", "--replay", str(folder / "schedule.json"), "--out",
                         "replays")
    assert replayed.returncode == 0, explain(replayed)
    [again] = run_folders(workdir / "replays")
    assert (again / "history.jsonl").read_bytes() == (folder / "history.jsonl").read_bytes()


def test_the_same_seed_in_two_processes_writes_the_same_history(workdir):
    for out in ("first", "second"):
        ran = ninelives(workdir, "sim", "zombies.toml", "--seed", "5", "--out", out)
        assert ran.returncode in (0, 1), explain(ran)
    [first], [second] = run_folders(workdir / "first"), run_folders(workdir / "second")
    assert (first / "history.jsonl").read_bytes() == (second / "history.jsonl").read_bytes()


def test_a_broken_engine_is_shrunk_to_a_numbered_story_and_a_counterexample_that_replays(
        workdir):
    ran = ninelives(workdir, "sim", "zombies.toml", "--seeds", "1..10", "--engine",
                    "sim_adapters:UNFENCED", "--shrink", "--budget", "40", "--out", "out")
    assert ran.returncode == 1, explain(ran)
    assert "FAIL fenced-writes (zombie-write)" in ran.stdout, explain(ran)
    assert "shrunk from" in ran.stdout and "job(s)" in ran.stdout and "\n1. +" in ran.stdout
    assert "<- fenced-writes" in ran.stdout
    path = next(line.split(": ", 1)[1] for line in ran.stdout.splitlines()
                if line.startswith("counterexample: "))
    saved = json.loads(Path(workdir, path).read_text())
    assert saved["fails"]["invariant"] == "fenced-writes" and saved["engine"] == \
        "sim_adapters:UNFENCED"
    replayed = ninelives(workdir, "sim", "--replay", path, "--out", "replays")
    assert replayed.returncode == 1, explain(replayed)
    assert "reproduced: the saved schedule failed fenced-writes (zombie-write)" in \
        replayed.stdout
    [again] = run_folders(workdir / "replays")
    shrunk = Path(workdir, path).parent / "shrunk"
    assert (again / "history.jsonl").read_bytes() == (shrunk / "history.jsonl").read_bytes()


@pytest.mark.parametrize("args,message", [
    (("smoke", "--seeds", "x"), "argument --seeds: must be N or A..B"),
    (("smoke", "--seeds", "5..2"), "is empty"),
    (("smoke", "--seeds", "0"), "argument --seeds: 0 names no seed"),
    (("smoke", "--seed", "1", "--seeds", "2"), "not allowed with argument --seed"),
    (("smoke", "--budget", "0"), "argument --budget: must be >= 1"),
    ((), "needs a SCENARIO"),
    (("--replay", "missing.json"), "missing.json does not exist"),
    (("--replay", "zombies.toml"), "is not valid JSON"),
    (("zombies.toml", "--seeds", "1", "--engine", "sim_adapters:ELSEWHERE"),
     "cannot run in simulation"),
    (("no-such-scenario",), "no scenario 'no-such-scenario'"),
])
def test_bad_input_exits_2_with_one_error_line_naming_it(workdir, args, message):
    ran = ninelives(workdir, "sim", *args, "--out", "out")
    assert ran.returncode == 2, explain(ran)
    assert "Traceback" not in ran.stderr, explain(ran)
    errors = [line for line in ran.stderr.splitlines()  # ours, or argparse's for a flag
              if line.startswith(("error: ", "ninelives sim: error: "))]
    assert len(errors) == 1 and message in errors[0], explain(ran)
