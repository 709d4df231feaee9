"""A run SIGKILLed halfway leaves a folder that `check`, `report` and `replay` work on, marked
partial: its history and snapshot rebuilt from what the run appended as it went."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ninelives(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaos.commands.cli", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


def killed_in_chaos(out) -> str:
    """Start `ninelives run smoke`, SIGKILL it once its chaos phase began, wait until its
    engine processes are gone; returns the run folder."""
    proc = subprocess.Popen([sys.executable, "-m", "chaos.commands.cli", "run", "smoke", "--profile",
                             "smoke", "--out", str(out), "--quiet"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def in_chaos():
            for folder, _, files in os.walk(out):
                if "events.jsonl" in files:
                    with open(os.path.join(folder, "events.jsonl"), encoding="utf-8") as fh:
                        if '"phase": "chaos"' in fh.read():
                            return folder
            return None
        run = wait_for(in_chaos, 120, "the run's chaos phase")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    wait_for(lambda: not any(run in " ".join(p.info["cmdline"] or ())
                             for p in psutil.process_iter(["cmdline"])), 30,
             "the killed run's engine processes ending")
    return run


def test_a_killed_run_is_checked_rendered_and_replayed_marked_partial(tmp_path):
    run = killed_in_chaos(tmp_path / "reports")
    assert not os.path.exists(os.path.join(run, "history.jsonl"))
    tampered = str(tmp_path / "tampered")  # a copy as the run left it, for the last case
    shutil.copytree(run, tampered, symlinks=True)
    with open(os.path.join(run, "report.json"), encoding="utf-8") as fh:
        start = json.load(fh)
    assert start["partial"] is True and start["result"] == "partial"

    checked = ninelives("check", run)
    assert checked.returncode in (1, 2), checked.stdout + checked.stderr
    assert "PARTIAL" in checked.stdout and "Traceback" not in checked.stderr
    assert "(partial run: gathered " in checked.stdout.splitlines()[-2]
    with open(os.path.join(run, "report.json"), encoding="utf-8") as fh:
        report = json.load(fh)
    assert report["partial"] is True and report["verdicts"]
    assert "pass" not in {v["verdict"] for v in report["verdicts"]}
    assert sum(v["checked"] for v in report["verdicts"]) > 0  # the evidence was read

    rendered = ninelives("report", run)
    assert rendered.returncode == 0, rendered.stderr
    with open(os.path.join(run, "report.html"), encoding="utf-8") as fh:
        page = fh.read()
    assert "Partial run" in page and "did not exercise what the scenario asked" not in page
    assert "partial run: " in page and " events, " in page
    with open(os.path.join(run, "summary.md"), encoding="utf-8") as fh:
        assert "Partial run" in fh.read()

    replayed = ninelives("replay", run, "--out", str(tmp_path / "replays"))
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "partial run" in replayed.stdout and "try 1: pass" in replayed.stdout

    # the same folder handed over by someone else, its scenario's counts past every bound:
    # refused naming the file and the field, not planned for hours
    start["scenario"]["run"]["jobs"] = 10 ** 11
    with open(os.path.join(tampered, "report.json"), "w", encoding="utf-8") as fh:
        json.dump(start, fh)
    refused = ninelives("check", tampered, timeout=60)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "report.json: field 'run.jobs' must be at most" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr


def test_an_interrupted_replay_names_the_folder_it_had_written(tmp_path, monkeypatch, capsys):
    """Ctrl-C while a replay's try checks its history (after its campaign's processes
    stopped, its folder long made): the interrupted line names that folder."""
    import chaos.run.runner
    from chaos.commands.cli import main

    def interrupted(*_):
        raise KeyboardInterrupt
    monkeypatch.setattr(chaos.run.runner, "run_checkers", interrupted)
    out = tmp_path / "replays"
    fixture = os.path.join(ROOT, "tests", "fixtures", "runs", "pass")
    assert main(["replay", fixture, "--out", str(out)]) == 130
    [run] = [folder for folder, _, files in os.walk(out) if "report.json" in files]
    err = capsys.readouterr().err
    assert f"its partial evidence is in {run}" in err, err
