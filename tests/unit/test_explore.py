"""Swarm testing and the explorer's parts (chaos.sim.swarm, chaos.explore): a swarm seed draws
its own mix of the scenario's faults and replays byte for byte, from its seed and from its
saved schedule; a choice prefix replays what it holds and draws the rest as a seeded run;
mutations keep to the parent's seed; the corpus keeps one replayable file per schedule; the
coverage of a run is its situations, refined by the point before them and their counts."""
from __future__ import annotations

import random

import pytest

from chaos.contract import load_engine
from chaos.explore import Corpus, Explorer, PrefixChoices, measure
from chaos.explore.cli import budget
from chaos.explore.schedules import ANY, DRAW, Kept, change, cut, mutate, seeded_rng, splice
from chaos.history import write_history
from chaos.spec.scenario import RATES, SHARES, load_scenario
from chaos.sim import ReplayChoices, SeededChoices, SimSpec, load_schedule, save_schedule, simulate
from chaos.sim.swarm import WINDOWS, apply, draw, swarm_spec

ENGINE = load_engine("reference")
EVERYTHING = load_scenario("everything", "smoke")


def configured(scenario) -> set[str]:
    f = scenario.faults
    return {n for n in (*RATES, *SHARES) if getattr(f, n) > 0}


def test_swarm_seeds_draw_different_mixes_of_the_configured_faults_and_the_same_mix_again():
    mixes = [draw(EVERYTHING, ENGINE, seed) for seed in range(1, 9)]
    assert len({tuple(m["off"]) for m in mixes}) == len(mixes)  # each seed its own mix
    assert draw(EVERYTHING, ENGINE, 3) == mixes[2]              # a pure function of the seed
    for mix in mixes:
        faults = apply(EVERYTHING, mix).faults
        on = configured(apply(EVERYTHING, mix))
        assert on <= configured(EVERYTHING)                     # never a fault not configured
        assert not on & set(mix["off"]) and on                  # left out: 0; one at least on
        for name, factor in mix["scale"].items():
            assert 0.5 <= factor <= 3.0
            assert getattr(faults, name) <= (1.0 if name in SHARES else float("inf"))
        assert faults.poison + faults.crash_loop + EVERYTHING.run.needs_review <= 0.5 + 1e-9
        if mix["points"] is not None:
            assert set(faults.crash_points) <= set(ENGINE.crashpoints)
    assert any(m["points"] is None for m in mixes) and any(m["points"] for m in mixes)


def test_half_the_swarm_seeds_aim_at_a_lease_window_the_engine_can_be_held_in():
    mixes = [draw(EVERYTHING, ENGINE, seed) for seed in range(1, 41)]
    windows = [m["window"] for m in mixes]
    assert 8 <= sum(w is not None for w in windows) <= 32 and set(windows) - {None} <= set(WINDOWS)
    aimed = next(m for m in mixes if m["window"])
    scenario = apply(EVERYTHING, aimed)
    added = scenario.aims[len(EVERYTHING.aims):]
    assert [a.point for a in added] == [t["point"] for t in WINDOWS[aimed["window"]]]
    lease = float(EVERYTHING.engine.get("lease") or 1.0)
    assert all(a.deadline == max(5.0, 4 * lease) or a.deadline == 1.0 for a in added)
    # an engine without crash points can be held nowhere: no window is drawn for it
    blind = type("Blind", (), {"name": "blind", "capabilities": frozenset(),
                                "crashpoints": ()})()
    assert all(draw(EVERYTHING, blind, seed)["window"] is None for seed in range(1, 21))


def history_bytes(result, path) -> bytes:
    write_history(str(path), result.history)
    return path.read_bytes()


def test_a_swarm_seed_replays_byte_for_byte_from_its_seed_and_from_its_saved_schedule(
        tmp_path):
    spec = swarm_spec(SimSpec(EVERYTHING, 4, ENGINE, "reference"))
    assert spec.swarm == draw(EVERYTHING, ENGINE, 4) and spec.scenario != EVERYTHING
    first = simulate(spec, SeededChoices(4))
    again = simulate(swarm_spec(SimSpec(EVERYTHING, 4, ENGINE, "reference")), SeededChoices(4))
    saved = save_schedule(str(tmp_path / "schedule.json"), first)
    loaded, choices, data = load_schedule(saved, ENGINE)
    assert data["swarm"] == spec.swarm and loaded.swarm == spec.swarm
    replayed = simulate(loaded, ReplayChoices(choices))
    expected = history_bytes(first, tmp_path / "first.jsonl")
    assert history_bytes(again, tmp_path / "again.jsonl") == expected
    assert history_bytes(replayed, tmp_path / "replayed.jsonl") == expected
    plain = simulate(SimSpec(EVERYTHING, 4, ENGINE, "reference"), SeededChoices(4))
    assert history_bytes(plain, tmp_path / "plain.jsonl") != expected


def test_a_prefix_replays_its_values_wraps_those_out_of_range_and_draws_the_rest_as_seeded():
    seeded, prefixed = SeededChoices(9), PrefixChoices((), seeded_rng(9))
    assert [seeded.choose(5) for _ in range(20)] == [prefixed.choose(5) for _ in range(20)]
    choices = PrefixChoices((3, 7, DRAW, ANY), random.Random(1))
    assert choices.choose(5) == 3 and choices.choose(5) == 2   # 7 wraps around to 2
    assert choices.choose(4, lambda rng: 1) == 1               # DRAW: the run's own odds
    assert 0 <= choices.choose(4, lambda rng: 1) < 4           # ANY: uniform
    assert choices.choose(1) == 0 and choices.record[:2] == [3, 2]


def test_mutations_keep_the_parents_seed_and_shape_and_make_valid_prefixes():
    rng = random.Random(0)
    parent = Kept(5, tuple(range(10)) * 3, 4, frozenset({"a"}))
    other = Kept(5, (9,) * 40, 4, frozenset({"b"}))
    for _ in range(50):
        changed = change(parent, rng)
        assert len(changed) == 30 and sum(a != b for a, b in zip(changed, parent.choices)) <= 4
        assert set(changed) <= set(range(10)) | {DRAW, ANY, 0}
        assert 4 <= len(cut(parent, rng)) <= 30 and cut(parent, rng)[:4] == [0, 1, 2, 3]
        joined = splice(parent, other, rng)
        assert joined[:4] == [0, 1, 2, 3] and len(joined) == 40
        candidate = mutate(parent, other, rng)
        assert candidate.seed == 5 and candidate.origin in ("change", "cut", "splice")


def test_the_corpus_keeps_one_replayable_file_per_schedule_failures_first(tmp_path):
    scenario = load_scenario("smoke", "smoke")
    result = simulate(SimSpec(scenario, 2, ENGINE, "reference"), SeededChoices(2))
    corpus = Corpus(str(tmp_path / "corpus"))
    path = corpus.keep(result, ["kill-mid-step"])
    assert corpus.keep(result, ["kill-mid-step"]) == path and len(corpus) == 1
    (tmp_path / "corpus" / "junk.json").write_text("{not json")
    [entry] = corpus.entries()
    assert (entry.seed, entry.choices, entry.swarm, entry.failed) == (
        2, tuple(result.choices), False, False)
    assert corpus.warnings and "junk.json" in corpus.warnings[0]
    spec, choices, _ = load_schedule(path, ENGINE)  # `ninelives sim --replay` reads it
    assert simulate(spec, ReplayChoices(choices)).history == result.history


def test_coverage_is_the_situations_reached_refined_by_point_and_count():
    result = simulate(SimSpec(EVERYTHING, 1, ENGINE, "reference"), SeededChoices(1))
    coverage = measure(result.history, result.snapshot)
    assert coverage.situations and set(coverage.situations) <= coverage.features
    for feature in coverage.features - set(coverage.situations):
        name, _, rest = feature.replace("*", "@").partition("@")
        assert name in coverage.situations and rest
    assert any("@" in f for f in coverage.features)  # a crash point preceded some situation


def test_the_explorer_keeps_what_reached_something_new_and_stops_at_its_run_budget(tmp_path):
    corpus = Corpus(str(tmp_path / "corpus"))
    explorer = Explorer(load_scenario("smoke", "smoke"), ENGINE, "reference", seed=1,
                        corpus=corpus)
    outcome = explorer.explore(budget=600, max_runs=6)
    assert outcome.failure is None and outcome.runs == 6 and outcome.replayed == 0
    assert outcome.kept == len(corpus) >= 1
    again = Explorer(load_scenario("smoke", "smoke"), ENGINE, "reference", seed=1,
                     corpus=corpus).explore(budget=600, max_runs=outcome.kept)
    assert again.replayed == outcome.kept
    assert set(again.first_reached) == set(outcome.first_reached)  # the corpus holds them


@pytest.mark.parametrize("text,seconds", [("90", 90), ("20s", 20), ("5m", 300), ("1.5h", 5400)])
def test_a_budget_is_seconds_or_minutes(text, seconds):
    assert budget(text) == seconds
