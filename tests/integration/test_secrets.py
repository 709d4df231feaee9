"""A provider key in a scenario's [engine] table reaches the engine and nothing else: no file
of the run folder, no process command line, no line on the terminal."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEY = "sk-test-9f2c71e0d4b8-not-a-real-key"


def keyed_scenario(tmp_path) -> str:
    """smoke.toml with KEY as the engine's provider key."""
    with open(os.path.join(ROOT, "scenarios", "smoke.toml"), encoding="utf-8") as fh:
        text = fh.read()
    path = tmp_path / "keyed.toml"
    path.write_text(text.replace("[engine]\n", f'[engine]\nprovider_key = "{KEY}"\n', 1))
    return str(path)


def command_lines_while(proc: subprocess.Popen, timeout: float) -> list[str]:
    """Every command line of `proc`'s descendants seen while it runs (sampled until it ends
    or `timeout` passes, when it is killed)."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    parent = psutil.Process(proc.pid)
    while proc.poll() is None and time.monotonic() < deadline:
        for child in parent.children(recursive=True):
            try:
                seen.add("\0".join(child.cmdline()))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    return sorted(seen)


def test_a_provider_key_reaches_the_engine_and_no_record_or_command_line(tmp_path):
    out = tmp_path / "reports"
    proc = subprocess.Popen(
        [sys.executable, "-m", "chaos.commands.cli", "run", keyed_scenario(tmp_path), "--profile",
         "smoke", "--out", str(out)], cwd=ROOT, stdout=open(tmp_path / "stdout", "wb"),
        stderr=open(tmp_path / "stderr", "wb"))
    lines = command_lines_while(proc, timeout=240)
    assert proc.returncode == 0, (tmp_path / "stdout").read_text() + (tmp_path / "stderr").read_text()
    workers = [c for c in lines if "\0worker\0" in c]
    senders = [c for c in lines if "\0send\0" in c]
    assert workers and senders, lines
    assert [c for c in lines if KEY in c] == []
    written = [os.path.join(d, f) for d, _, files in os.walk(out) for f in files]
    assert any(f.endswith("report.json") for f in written), written
    leaked = [f for f in written + [str(tmp_path / "stdout"), str(tmp_path / "stderr")]
              if KEY.encode() in open(f, "rb").read()]
    assert leaked == []
    (run,) = {os.path.dirname(f) for f in written if f.endswith("report.json")}
    with open(os.path.join(run, "report.json"), encoding="utf-8") as fh:
        assert json.load(fh)["scenario"]["engine"]["provider_key"] == "***"
    with open(os.path.join(run, "provider.jsonl"), encoding="utf-8") as fh:
        calls = [json.loads(line) for line in fh]
    # The fake records whether a call carried a bearer key, never the key itself.
    assert calls and all(call["auth"] for call in calls)
