"""Shards and campaign records: which seeds a shard runs (a fixed function of the seed), a bad
--shard refused naming the flag in every command that takes it, the counts of a campaign
summed shard by shard as they are run by run, and the workflow commands that annotate a
failure."""
from __future__ import annotations

import random

import pytest

import chaos.commands.cli
from chaos.run.campaign import Tally
from chaos.reports.render.campaign import annotations
from chaos.run.shards import Shard, parse_shard
from chaos.situations import Reached


@pytest.mark.parametrize("text,index,count", [("1/1", 1, 1), ("2/3", 2, 3), (" 3 / 3 ", 3, 3)])
def test_a_shard_is_i_of_n(text, index, count):
    assert parse_shard(text) == Shard(index, count)


def test_the_shards_of_a_range_split_it_by_the_seed_alone():
    seeds = range(1, 7)
    parts = [Shard(i, 3).seeds(seeds) for i in (1, 2, 3)]
    assert parts == [[1, 4], [2, 5], [3, 6]]
    assert sorted(s for p in parts for s in p) == list(seeds)
    # the rule is (s - A) % N == I - 1: the same seeds whatever else runs beside them
    assert Shard(2, 3).seeds(range(11, 20)) == [12, 15, 18]


def test_a_shard_of_no_seed_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match="--shard 3/3: .*use at most 2 shards"):
        Shard(3, 3).seeds(range(1, 3))


def test_an_explore_shard_draws_only_its_own_seeds():
    rng = random.Random(1)
    drawn = [Shard(2, 3).draw(rng) for _ in range(2000)]
    assert all((s - 1) % 3 == 1 and 1 <= s < 1 << 31 for s in drawn)
    assert len(set(drawn)) > 1990
    # the whole (one shard) draws as the explorer always did
    a, b = random.Random(5), random.Random(5)
    assert [Shard(1, 1).draw(a) for _ in range(50)] == [b.randrange(1, 1 << 31)
                                                        for _ in range(50)]


BAD_SHARDS = [("0/3", "I must be 1 to 3"), ("4/3", "I must be 1 to 3"),
              ("1/0", "N must be 1 to 10,000"), ("x", "must be I/N"), ("3", "must be I/N"),
              ("-1/2", "must be I/N"), ("1/20000", "N must be 1 to 10,000"), ("", "must be I/N")]
SHARD_COMMANDS = [["sim", "smoke", "--seeds", "1..6"], ["explore", "smoke"],
                  ["run", "smoke", "--seeds", "1..6"]]


@pytest.mark.parametrize("argv", SHARD_COMMANDS, ids=lambda v: v[0])
@pytest.mark.parametrize("text,says", BAD_SHARDS, ids=[t or "empty" for t, _ in BAD_SHARDS])
def test_a_bad_shard_exits_2_naming_the_flag(argv, text, says, capsys):
    with pytest.raises(SystemExit) as exited:
        chaos.commands.cli.build_parser().parse_args(argv + [f"--shard={text}"])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert "--shard" in err and says in err


@pytest.mark.parametrize("argv,says", [
    (["sim", "smoke", "--seed", "3", "--shard", "1/2"], "--shard 1/2 splits --seeds"),
    (["sim", "smoke", "--seeds", "1..2", "--shard", "3/3"], "--shard 3/3: seeds 1..2"),
    (["run", "smoke", "--shard", "1/2"], "--shard 1/2 splits --seeds"),
    (["run", "smoke", "--seeds", "1..2", "--shard", "3/3"], "--shard 3/3: seeds 1..2"),
])
def test_a_shard_that_splits_nothing_exits_2_naming_the_flag(argv, says, tmp_path, capsys):
    assert chaos.commands.cli.main(argv + ["--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def verdict(name: str, kind: str, exercised: bool | None = None, reason: str = "") -> dict:
    v = {"name": name, "verdict": kind, "error_count": int(kind == "fail"), "reason": reason,
         "metrics": {}}
    if exercised is not None:
        v.update(exercised=exercised, situations={"memo-resume": int(exercised)})
    return v


RUNS = [  # seed, verdicts, memo-resume count, exit code
    (1, [verdict("a", "pass", True), verdict("b", "unknown", reason="none at 1")], 2, 0),
    (2, [verdict("a", "fail", reason="broke at 2"), verdict("b", "pass")], 0, 1),
    (3, [verdict("a", "pass", False), verdict("b", "unknown", reason="none at 3")], 0, 0),
    (4, [verdict("a", "fail", reason="broke at 4"), verdict("b", "pass")], 5, 1),
]


def tally_of(runs) -> Tally:
    tally = Tally()
    for seed, verdicts, count, code in runs:
        tally.add(seed, verdicts, {"memo-resume": Reached("memo-resume", count)}, code,
                  rerun=f"rerun {seed}")
    return tally


def test_shards_absorbed_in_any_order_give_the_whole_campaign_s_record():
    whole = tally_of(RUNS).to_json()
    merged = Tally()
    for part in (RUNS[3:], RUNS[:1], RUNS[1:3]):
        merged.absorb(Tally.from_json(tally_of(part).to_json()))
    assert merged.to_json() == whole
    a = whole["invariants"]["a"]
    assert (a["verdict"], a["fail"], a["failing_seeds"], a["reason"]) == \
        ("fail", 2, [2, 4], "broke at 2")
    assert whole["situations"]["memo-resume"] == {"count": 7, "runs": 2, "unobservable": 0,
                                                  "why": ""}
    assert [f["seed"] for f in whole["failing"]] == [2, 4] and whole["exit_code"] == 1


@pytest.mark.parametrize("runs,verdict_,exercised", [
    ([(1, [verdict("a", "pass", False)], 0, 0), (2, [verdict("a", "pass", True)], 1, 0)],
     "pass", True),   # exercised in one run: a pass
    ([(1, [verdict("a", "pass", False)], 0, 0), (2, [verdict("a", "unknown")], 0, 0)],
     "pass", False),  # no run exercised it: pass, not exercised
    ([(1, [verdict("a", "unknown")], 0, 0)], "unknown", None),
])
def test_not_exercised_and_unknown_stand_only_where_no_run_did_better(runs, verdict_,
                                                                        exercised):
    v = tally_of(runs).verdicts()["a"]
    assert (v["verdict"], v["exercised"]) == (verdict_, exercised)


def test_a_campaign_of_unknowns_or_of_a_run_in_error_is_an_error():
    assert tally_of([(1, [verdict("a", "unknown")], 0, 0)]).exit_code() == 2
    assert tally_of([(1, [verdict("a", "pass")], 0, 2)]).exit_code() == 2
    assert Tally().exit_code() == 2
    assert tally_of([(1, [verdict("a", "pass")], 0, 0)]).exit_code() == 0


def test_a_failing_invariant_is_annotated_as_a_workflow_command_escaped():
    tally = tally_of([(1, [verdict("a", "fail", reason="50% lost,\nthen: more")], 0, 1)])
    record = {**tally.to_json(), "key": {}, "shards": {"count": 1, "given": [1]}}
    [line] = annotations(record)
    assert line.startswith("::error title=ninelives%3A a failed::a failed in 1 of 1 runs")
    assert "50%25 lost,%0Athen: more" in line and line.endswith("| rerun: rerun 1")
