"""A campaign spread over shards and merged: `sim --seeds 1..6` run as three shards and merged
gives the verdicts, situation counts and failing seeds of the unsharded run (a simulation is
deterministic per seed: compared exactly), on a correct engine and on a broken one; explore's
shards draw apart and merge; `merge` refuses what is not the shards of one campaign, naming
the folder; `annotate` prints a failure as a GitHub workflow command."""
from __future__ import annotations

import json
import os

import pytest

from chaos.commands.cli import main
from chaos.reports.merge import require_exercised

SAME = ("invariants", "situations", "results", "seeds", "runs", "not_exercised", "exit_code",
        "result", "key")


def sim(out, *flags: str, scenario: str = "smoke") -> int:
    return main(["sim", scenario, "--profile", "smoke", "--seeds", "1..6", "--out", str(out),
                 "--quiet", *flags])


def record(folder) -> dict:
    with open(os.path.join(folder, "campaign.json"), encoding="utf-8") as fh:
        return json.load(fh)


CAMPAIGNS = {
    "reference": ("smoke", [], 0),
    # skips its memo check: fails memo-consistent and no-rebill-after-commit in every seed
    "broken": ("scenarios/mutants/memo-hits.toml",
               ["--engine", "chaos.mutants:memo_check_skipped"], 1),
}


def test_a_merge_that_requires_exercised_invariants_is_an_error_when_one_was_not(tmp_path,
                                                                                 capsys):
    for i in (1, 2):
        assert sim(tmp_path / f"s{i}", "--shard", f"{i}/2") == 0
    shards = [str(tmp_path / "s1"), str(tmp_path / "s2")]
    assert main(["merge", *shards, "--out", str(tmp_path / "plain")]) == 0
    unexercised = record(tmp_path / "plain")["not_exercised"]
    assert unexercised  # smoke submits nothing twice: submissions-idempotent, for one
    capsys.readouterr()
    assert main(["merge", *shards, "--out", str(tmp_path / "strict"),
                 "--require-exercised"]) == 2
    said = capsys.readouterr().out
    strict = record(tmp_path / "strict")
    assert strict["result"] == "error" and strict["required_exercised"] == unexercised
    assert f"exercised in none: {', '.join(unexercised)}" in said
    # a failure stays a failure: exit 1 says an invariant failed, whatever else
    assert require_exercised({"exit_code": 1, "result": "fail", "not_exercised": ["x"]}) \
        == {"exit_code": 1, "result": "fail", "not_exercised": ["x"]}


@pytest.mark.parametrize("name", CAMPAIGNS)
def test_three_shards_merged_equal_the_unsharded_run(name, tmp_path, capsys):
    scenario, flags, code = CAMPAIGNS[name]
    assert sim(tmp_path / "whole", *flags, scenario=scenario) == code
    for i in (1, 2, 3):
        assert sim(tmp_path / f"s{i}", *flags, "--shard", f"{i}/3", scenario=scenario) in (0, 1)
        assert record(tmp_path / f"s{i}")["seeds"] == [i, i + 3]
    shards = [str(tmp_path / f"s{i}") for i in (3, 1, 2)]
    assert main(["merge", *shards, "--out", str(tmp_path / "merged")]) == code
    whole, merged = record(tmp_path / "whole"), record(tmp_path / "merged")
    for key in SAME:
        assert merged[key] == whole[key], key
    assert merged["shards"] == {**whole["shards"], "count": 3, "given": [1, 2, 3]}
    assert [(f["seed"], f["invariants"]) for f in merged["failing"]] == \
        [(f["seed"], f["invariants"]) for f in whole["failing"]]
    for f in merged["failing"]:  # each failing seed's folder, under its shard's folder
        assert os.path.exists(tmp_path / "merged" / f["run_dir"] / "schedule.json")
        assert f["run_dir"].startswith(f"..{os.sep}s")
        assert f["rerun"].startswith("ninelives sim ") and f"--seed {f['seed']}" in f["rerun"]
    assert sum(s["count"] for s in merged["situations"].values()) > 0
    for page in ("summary.md", "junit.xml", "report.html"):
        assert (tmp_path / "merged" / page).stat().st_size > 0
    summary = (tmp_path / "merged" / "summary.md").read_text()
    assert "3 shards merged" in summary and ("FAIL" if code else "PASS") in summary
    if code:
        junit = (tmp_path / "merged" / "junit.xml").read_text()
        assert '<failure type="fail" message="failed in 6 of 6 runs' in junit
        capsys.readouterr()
        assert main(["annotate", str(tmp_path / "merged")]) == 1
        lines = capsys.readouterr().out.splitlines()
        assert "::error title=ninelives%3A memo-consistent failed::memo-consistent failed " \
               "in 6 of 6 runs (seeds 1, 2, 3, 4, 5, 6)" in "\n".join(lines)


def test_explore_shards_draw_apart_and_merge(tmp_path):
    for i in (1, 2):
        assert main(["explore", "smoke", "--profile", "smoke", "--budget", "2", "--shard",
                     f"{i}/2", "--corpus", str(tmp_path / f"corpus{i}"), "--out",
                     str(tmp_path / f"s{i}"), "--quiet"]) == 0
        kept = [json.loads(p.read_text())["seed"] for p in (tmp_path / f"corpus{i}").iterdir()]
        assert kept and all((s - 1) % 2 == i - 1 for s in kept)
        assert record(tmp_path / f"s{i}")["budget_per_shard"] == 1.0
    assert main(["merge", str(tmp_path / "s1"), str(tmp_path / "s2"), "--out",
                 str(tmp_path / "m")]) == 0
    merged = record(tmp_path / "m")
    assert merged["runs"] == record(tmp_path / "s1")["runs"] + record(tmp_path / "s2")["runs"]
    assert merged["key"]["command"] == "explore" and merged["seeds"] is None


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Shards 1 and 3 of 3 of seeds 1..6, shard 1 of 2 of the same seeds, and shard 2 of 3
    at another profile."""
    root = tmp_path_factory.mktemp("shards")
    for name, shard, profile in (("a1", "1/3", "smoke"), ("a3", "3/3", "smoke"),
                                 ("b1", "1/2", "smoke"), ("c2", "2/3", "ci")):
        assert main(["sim", "smoke", "--profile", profile, "--seeds", "1..6", "--shard",
                     shard, "--out", str(root / name), "--quiet"]) == 0
    (root / "empty").mkdir()
    (root / "other").mkdir()
    (root / "other" / "campaign.json").write_text('{"schema": "something else"}')
    return root


@pytest.mark.parametrize("given,says", [
    (["a1", "a3"], "shard 2 of 3 is missing: given 1 ({a1}), 3 ({a3})"),
    (["a1"], "shard 2, 3 of 3 are missing"),
    (["a1", "a1", "a3"], "{a1} and {a1} both hold shard 1 of 3"),
    (["a1", "a3", "c2"], "{c2} is a shard of another campaign than {a1}: its profile is "
                         "'ci', not 'smoke'"),
    (["a1", "b1"], "{b1} is of 2 shards, {a1} of 3"),
    (["a1", "empty"], "{empty} is no shard output: it holds no campaign.json"),
    (["a1", "nowhere"], "{nowhere}: no such folder"),
    (["a1", "other"], "{other}/campaign.json is not a campaign record"),
])
def test_merge_refuses_what_is_not_one_campaign_s_shards_naming_the_folder(given, says, shards,
                                                                           tmp_path, capsys):
    folders = {name: str(shards / name) for name in given}
    assert main(["merge", *(folders[name] for name in given), "--out",
                 str(tmp_path / "m")]) == 2
    assert f"error: {says.format(**folders)}" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_annotate_a_run_folder_and_refuse_a_folder_of_neither(tmp_path, capsys):
    fixture = os.path.join(os.path.dirname(__file__), "..", "fixtures", "runs", "fail")
    assert main(["annotate", fixture]) == 1
    out = capsys.readouterr().out
    assert out.startswith("::error title=ninelives%3A ") and " failed::" in out
    assert "rerun: ninelives run scenarios/mutants/memo-hits.toml --seed 1" in out
    assert main(["annotate", str(tmp_path)]) == 2
    assert "holds neither a run's report.json nor a campaign's campaign.json" in \
        capsys.readouterr().err
