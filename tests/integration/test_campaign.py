"""Whole chaos runs against the reference engine: real processes, real SIGKILL, real files."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from chaos.checkers import INVARIANTS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ninelives(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaos.commands.cli", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)


def only_run(out) -> str:
    """The one run folder under `out` (reports/<scenario>/<run-id>)."""
    runs = [os.path.join(d, r) for d, _, files in os.walk(out) for r in files
            if r == "report.json"]
    assert len(runs) == 1, runs
    return os.path.dirname(runs[0])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_smoke_passes_on_the_reference_engine(tmp_path, seed):
    done = ninelives("run", "smoke", "--profile", "smoke", "--seed", str(seed),
                     "--out", str(tmp_path), "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run(tmp_path)
    report = json.load(open(os.path.join(run, "report.json")))
    assert report["result"] == "pass" and report["seed"] == seed
    # smoke has no operator fault nor power cut: those checks have nothing to judge, and
    # say so
    assert {v["name"]: v["verdict"] for v in report["verdicts"] if v["verdict"] != "pass"} == {
        "operator-moves": "unknown", "durable-commits": "unknown"}
    assert all("no operator action" in v["reason"] or v["reason"] == "no power cut in this run"
               for v in report["verdicts"] if v["verdict"] == "unknown")
    assert [v["name"] for v in report["verdicts"]] == list(INVARIANTS)
    assert report["faults_applied"].get("kill", 0) + report["faults_applied"].get("crash_point", 0) > 0
    assert "PASS" in done.stdout and f"--seed {seed}" in done.stdout
    for name in ("history.jsonl", "snapshot.json", "plan.json", "scenario.json", "engine.db"):
        assert os.path.exists(os.path.join(run, name)), name


def test_check_recomputes_the_same_verdicts_from_the_saved_history(tmp_path):
    assert ninelives("run", "smoke", "--profile", "smoke", "--out", str(tmp_path),
                     "--quiet").returncode == 0
    run = only_run(tmp_path)
    recorded = open(os.path.join(run, "report.json"), "rb").read()
    before = json.loads(recorded)["verdicts"]
    done = ninelives("check", run)
    assert done.returncode == 0, done.stdout + done.stderr
    after = json.load(open(os.path.join(run, "check.json")))["verdicts"]
    assert open(os.path.join(run, "report.json"), "rb").read() == recorded  # kept as it was
    assert [(v["name"], v["verdict"], v["checked"]) for v in after] == \
        [(v["name"], v["verdict"], v["checked"]) for v in before]


def test_a_failed_invariant_exits_1_even_when_a_fault_never_fired(tmp_path):
    # No sender: the outbox never drains (all-jobs-settle fails) and receiver_drop cannot fire.
    scenario = tmp_path / "unsent.toml"
    scenario.write_text('name = "unsent"\n[run]\njobs = 4\nworkers = 1\nsenders = 0\n'
                        'chaos = 1.0\nheal = 0.1\ndrain = 3.0\n[faults]\nreceiver_drop = 1.0\n')
    done = ninelives("run", str(scenario), "--out", str(tmp_path / "out"), "--quiet")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "never fired: receiver_drop" in done.stdout and "FAIL" in done.stdout


def test_a_bad_scenario_is_refused_naming_file_and_field(tmp_path):
    scenario = tmp_path / "typo.toml"
    scenario.write_text('name = "typo"\n[faults]\nkil = 1.0\n')
    done = ninelives("run", str(scenario), "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert "typo.toml" in done.stderr and "faults.kil" in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_runner_killed_mid_run_leaves_no_process_behind(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "chaos.commands.cli", "run", "kill-storm",
                             "--profile", "smoke", "--out", str(tmp_path), "--quiet"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runner = psutil.Process(proc.pid)
    try:
        deadline = time.monotonic() + 60
        children: list[psutil.Process] = []
        while time.monotonic() < deadline and len(children) < 4:
            children = runner.children(recursive=True)
            time.sleep(0.05)
        assert len(children) >= 4, "the run never started its workers and senders"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        gone, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, f"orphans after the runner died: {[p.pid for p in alive]}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for child in psutil.Process().children(recursive=True):
            if child.pid != proc.pid:
                child.kill()
