"""The pytest plugin (chaos.testing.pytest_plugin) in a user's project: a fresh folder with one test
file, run by pytest in a process of its own (pytester), as a user's `pytest` runs it.

A planted-bug engine fails the test with its witness and the command that replays it (and
that command reproduces the failure); the failing seed is tried first by the next session
and forgotten after passing three times in a row; the reference engine passes, by the
fixture, the marker and a real-process run; --ninelives-require-exercised fails a pass that
exercised nothing; an exploration keeps its failure and replays it first; `pytest --help`
lists the options and `-p no:ninelives` removes them. Simulated, small seed ranges: seconds
each; one real run, in the smoke profile.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from chaos.testing.remembered import FORGET_AFTER, RememberedSeeds, check_key

pytest_plugins = ["pytester"]

#: A toy-engine bug that fails lost-lease at seed 2, not at seed 1 (tests/examples/
#: test_planted.py): its completion is not fenced, so a zombie writes over a new holder.
UNFENCED = "from examples.toy_engine.planted import UNFENCED_COMPLETION as ENGINE\n"
FIXED = "from examples.toy_engine.adapter import TOY as ENGINE\n"
LOST_LEASE_TEST = """
def test_my_engine_keeps_its_leases(ninelives):
    ninelives.sim("lost-lease", "myengine:ENGINE", seeds="1..3",
                  engine_set={"call_timeout": 0.8})
"""


def session(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """One pytest session in the user's folder, in a process of its own."""
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=240)


def tried(result: pytest.RunResult) -> list[str]:
    """Every "seeds tried, in order: ..." line of the session's failure reports.

    The short summary at the end is left out: where pytest sees a CI (CI or BUILD_NUMBER in
    the environment) it prints each failure's message there whole, a second time.
    """
    lines = result.outlines
    end = next((i for i, line in enumerate(lines) if "short test summary info" in line),
               len(lines))
    return [line.split(": ", 1)[1] for line in lines[:end]
            if line.startswith("seeds tried, in order: ")]


def test_a_planted_bug_fails_with_its_witness_and_replay_command_and_is_tried_first_next_time(
        pytester: pytest.Pytester):
    pytester.makepyfile(myengine=UNFENCED, test_leases=LOST_LEASE_TEST)
    first = session(pytester)
    first.assert_outcomes(failed=1)
    out = first.stdout.str()
    assert "seed 2: FAIL" in out
    assert re.search(r"fenced-writes \(zombie-write\): job doc-\d+: toy-\S+ wrote", out), out
    assert "situations reached: " in out and "zombie-write-after-takeover" in out
    assert tried(first) == ["1 pass, 2 fail"]
    replay = re.search(r"^replay it: ninelives sim --replay (\S+)$", out, re.M)
    assert replay, out
    assert "is remembered in .ninelives/seeds/" in out and "tried first next time" in out
    # The command the failure printed replays it: the same failure, from the user's folder
    again = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ninelives"), "sim", "--replay",
         replay.group(1), "--out", "replays"], cwd=pytester.path, capture_output=True,
        text=True, timeout=240, env={**os.environ, "PYTHONPATH": str(pytester.path)})
    assert again.returncode == 1, again.stdout + again.stderr
    assert "reproduced: the saved schedule failed" in again.stdout
    second = session(pytester)
    second.assert_outcomes(failed=1)
    assert tried(second) == ["2 (remembered) fail"]  # the remembered seed first, and alone


def test_a_remembered_seed_is_tried_first_until_it_passed_three_times_in_a_row(
        pytester: pytest.Pytester):
    pytester.makepyfile(myengine=FIXED, test_leases=LOST_LEASE_TEST)
    key = check_key("sim", "myengine:ENGINE", "lost-lease", "ci", {"call_timeout": 0.8})
    RememberedSeeds(str(pytester.path / ".ninelives"), key).failed(
        2, [("fenced-writes", "zombie-write")])
    assert FORGET_AFTER == 3
    for _ in range(FORGET_AFTER):
        fixed = session(pytester, "-rP")
        fixed.assert_outcomes(passed=1)
        assert tried(fixed) == ["2 (remembered) pass, 1 pass, 3 pass"]
    assert "seed 2 passed 3 times in a row since it failed: forgotten" in fixed.stdout.str()
    after = session(pytester, "-rP")
    after.assert_outcomes(passed=1)
    assert tried(after) == ["1 pass, 2 pass, 3 pass"]


def test_the_reference_passes_by_marker_and_a_planted_bug_fails_by_marker(
        pytester: pytest.Pytester):
    pytester.makepyfile(test_marked="""
        import pytest

        @pytest.mark.ninelives("smoke", seeds="1..2", profile="smoke")
        def test_reference():
            pass

        @pytest.mark.ninelives("smoke", engine="examples.toy_engine.planted:SENT_BEFORE_SEND",
                               seeds=1)
        def test_sent_before_send():
            pass

        @pytest.mark.ninelives("smoke", budget=5)
        def test_a_sim_takes_no_budget():
            pass
    """)
    result = session(pytester, "-rP")
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    assert "effects-complete (marked-sent-not-applied)" in out
    assert "replay it: ninelives sim --replay .ninelives/runs/smoke/" in out
    assert "takes one scenario and" in out and "got budget" in out
    assert "PASS: every invariant with evidence holds" in out  # the reference's -rP section


def test_require_exercised_fails_a_pass_whose_invariants_reached_none_of_their_situations(
        pytester: pytest.Pytester):
    pytester.makepyfile(test_reference="""
        def test_reference(ninelives):
            ninelives.sim("smoke", seeds=1, profile="smoke")
    """)
    session(pytester).assert_outcomes(passed=1)
    strict = session(pytester, "--ninelives-require-exercised")
    strict.assert_outcomes(failed=1)
    out = strict.stdout.str()
    assert "ERROR: passed, but not exercised (--ninelives-require-exercised): " in out
    assert "lease-kept" in out and "situations reached: " in out


def test_an_exploration_keeps_its_failure_and_replays_it_first(pytester: pytest.Pytester):
    pytester.makepyfile(test_explore="""
        def test_explore(ninelives):
            ninelives.explore("smoke", "examples.toy_engine.planted:SENT_BEFORE_SEND",
                              budget="20s", profile="smoke")
    """)
    first = session(pytester)
    first.assert_outcomes(failed=1)
    assert "effects-complete" in first.stdout.str()
    assert "replayed first next time" in first.stdout.str()
    second = session(pytester)
    second.assert_outcomes(failed=1)
    assert "(replayed from the corpus, seed " in second.stdout.str()


def test_a_real_run_of_the_reference_in_the_smoke_profile_passes(pytester: pytest.Pytester):
    pytester.makepyfile(test_real="""
        def test_real(ninelives):
            outcome = ninelives.run("smoke", profile="smoke")
            assert outcome.tried == [(1, False, "pass")]
    """)
    session(pytester).assert_outcomes(passed=1)


def test_pytest_help_lists_the_options_and_no_ninelives_turns_the_plugin_off(
        pytester: pytest.Pytester):
    shown = session(pytester, "--help").stdout.str()
    for option in ("--ninelives-seeds", "--ninelives-profile", "--ninelives-budget",
                   "--ninelives-engine", "--ninelives-require-exercised",
                   "--ninelives-shrink", "--ninelives-shard", "--ninelives-database",
                   "ninelives_database"):
        assert option in shown, option
    assert "--ninelives-seeds" not in session(pytester, "-p", "no:ninelives", "--help").stdout.str()
    pytester.makepyfile(test_fixture="def test_it(ninelives):\n    pass\n")
    off = session(pytester, "-p", "no:ninelives")
    off.assert_outcomes(errors=1)
    assert "fixture 'ninelives' not found" in off.stdout.str()
