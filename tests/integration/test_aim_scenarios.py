"""The aimed scenarios on the reference engine: each passes in simulation and reaches its
window (its aim fired, the condition met); a mutant whose completion is unfenced is caught
by aim-zombie-completion; a real run holds a real process, reports it, and leaves none."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from chaos.contract import load_engine
from chaos.reports.report import exit_code_for
from chaos.spec.scenario import load_scenario
from chaos.sim import SeededChoices, SimSpec, simulate
from tests.marked import MARK, carrying

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: scenario -> the release reason every hold of its first aim must show (the window reached)
WINDOWS = {
    "aim-zombie-completion": "takeover",
    "aim-zombie-heartbeat": "takeover",
    "aim-call-after-takeover": "point",
    "aim-commit-after-lapse": None,  # an expiry: no hold, the expiry itself is the window
    "aim-memo-resume-effects": "takeover",
    "aim-outbox-takeover": "takeover",
}


def _sim(name: str, seed: int, engine_spec: str = "reference"):
    scenario = load_scenario(name, "smoke")
    engine = load_engine(engine_spec)
    return simulate(SimSpec(scenario, seed, engine, engine_spec), SeededChoices(seed))


def _aim_events(result, type_: str, aim: int = 1) -> list[dict]:
    return [e for e in result.history
            if e["src"] == "nemesis" and e["type"] == type_ and e.get("aim") == aim]


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_each_aimed_scenario_passes_on_the_reference_and_reaches_its_window(name, seed):
    result = _sim(name, seed)
    assert not result.failed, [v.name for v in result.failed]
    if WINDOWS[name] is None:
        expired = _aim_events(result, "expire")
        assert expired and any(e["leases"] for e in expired)
        return
    holds, releases = _aim_events(result, "hold"), _aim_events(result, "release")
    assert holds, f"{name} seed {seed}: the aim never fired"
    assert [r["reason"] for r in releases] == [WINDOWS[name]] * len(holds)


def test_the_memo_resume_scenario_resumes_the_taken_job_from_its_memo():
    result = _sim("aim-memo-resume-effects", 1)
    (held,) = _aim_events(result, "hold", 1)
    (resumed,) = _aim_events(result, "hold", 2)
    assert resumed["job"] == held["job"]
    # the new owner finished the last step with no call of its own: the zombie's memo
    job = held["job"]
    last = [e for e in result.history if e.get("job") == job and e["type"] == "memo"]
    assert len(last) >= 1 and all(e["worker"] for e in last)


def test_an_unfenced_completion_is_caught_by_the_zombie_aim_at_seed_1():
    result = _sim("aim-zombie-completion", 1, "chaos.mutants:no_token_on_complete")
    assert "fenced-writes" in {v.name for v in result.failed}


def test_a_real_aimed_run_holds_a_process_reports_it_and_leaves_none(tmp_path):
    mark = f"aim-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "runs"
    done = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ninelives"), "run", "aim-zombie-completion", "--profile", "smoke",
         "--seed", "1", "--out", str(out)],
        cwd=ROOT, env={**os.environ, MARK: mark}, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "aim 1 (hold at role:after_call until takeover): held worker-" in done.stdout
    assert "claimed it at +" in done.stdout
    assert carrying(mark) == []
    import json
    (run,) = [p for p in (out / "aim-zombie-completion").iterdir() if not p.is_symlink()]
    report = json.loads((run / "report.json").read_text())
    (row,) = report["aims"]
    assert row["fired"] == 1 and "claimed it at" in row["evidence"][0]
    assert report["faults_applied"].get("aim_hold") == 1
    assert exit_code_for(report["verdicts"], report["faults_unfired"]) == 0
