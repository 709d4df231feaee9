"""An adapter that raises ends the command with exit 2 and one line naming the adapter, the
method and the exception, never exit 1 (an invariant failed) and never a traceback on the
terminal: the traceback goes into the run folder when there is one, the run marked partial,
and no process is left behind (see docs/engines.md, "When your adapter raises")."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid

import pytest

from tests.contract.broken_adapters import message
from tests.marked import MARK, carrying

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BROKEN = "tests.contract.broken_adapters"


def ninelives(*args: str, timeout: float = 240) -> tuple[subprocess.CompletedProcess, str]:
    """Run a harness command with a marker of its own in its environment; returns it and the
    marker (tests.marked.carrying finds what it left)."""
    mark = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith("NINELIVES_")}
    env[MARK] = mark
    done = subprocess.run([sys.executable, "-m", "chaos.commands.cli", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout, env=env)
    return done, mark


def error_line(done: subprocess.CompletedProcess) -> str:
    """The one `error:` line on stderr (and no traceback there)."""
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, done.stderr
    return lines[0]


def run_broken(tmp_path, spec: str) -> tuple[str, str]:
    """`ninelives run smoke --profile smoke` with the adapter `spec`: its error line and
    its output folder; nothing it started is left running."""
    out = str(tmp_path / "out")
    done, mark = ninelives("run", "smoke", "--profile", "smoke", "--engine", spec, "--out", out,
                           "--quiet")
    line = error_line(done)
    assert carrying(mark) == [], "processes left behind"
    return line, out


def assert_kept(line: str, out: str, method: str, raised: str | None = None) -> None:
    """The traceback is in the run folder the line names, and the run is marked partial."""
    found = re.search(r"\(traceback: (\S+adapter-error\.txt);", line)
    assert found, line
    path = found.group(1)
    folder = os.path.dirname(path)
    assert os.path.commonpath([folder, out]) == out
    text = open(path, encoding="utf-8").read()
    assert "Traceback" in text and (raised or message(method)) in text
    with open(os.path.join(folder, "report.json"), encoding="utf-8") as fh:
        report = json.load(fh)
    assert report["partial"] is True and report["result"] == "partial"
    assert report["adapter_error"]["method"] == method
    assert report["adapter_error"]["traceback"] == "adapter-error.txt"
    assert os.path.exists(os.path.join(folder, "events.jsonl"))  # the evidence so far


#: method -> whether a run folder exists when it first raises
METHODS = {"settings": False, "install": True, "submit": True, "command": True,
           "progress": True, "operations": True, "snapshot": True, "integrity": True}


@pytest.mark.parametrize("method", METHODS)
def test_a_method_that_raises_ends_the_run_with_exit_2_naming_it(method, tmp_path):
    spec = f"{BROKEN}:BROKEN_{method.upper()}"
    line, out = run_broken(tmp_path, spec)
    raised = "KeyError: 'broken settings on purpose'" if method == "settings" \
        else f"RuntimeError: {message(method)}"
    assert line.startswith(f"error: adapter {spec}: {method} raised {raised}"), line
    if METHODS[method]:
        assert_kept(line, out, method)
    else:
        assert "traceback:" not in line and not os.path.exists(out)


@pytest.mark.parametrize("spec, method, raised", [
    (f"{BROKEN}:BrokenConstructor", "constructor", f"RuntimeError: {message('constructor')}"),
    ("tests.contract.broken_on_import:ANY", "import", "RuntimeError: broken import on purpose"),
], ids=["constructor", "import"])
def test_an_adapter_that_cannot_be_built_ends_with_exit_2_and_no_folder(spec, method, raised,
                                                                        tmp_path):
    line, out = run_broken(tmp_path, spec)
    assert line == f"error: adapter {spec}: {method} raised {raised}"
    assert not os.path.exists(out)


def test_a_setting_the_adapter_refuses_is_still_named(tmp_path):
    """A ValueError from settings() is the contract's refusal, not a failure: the field."""
    done, _ = ninelives("run", "smoke", "--profile", "smoke", "--engine",
                        "examples.toy_engine.adapter:TOY", "--engine-set", "leese=2",
                        "--out", str(tmp_path / "out"))
    line = error_line(done)
    assert "[engine]" in line and "leese" in line and "adapter" not in line, line


def test_sim_with_an_observer_that_raises_exits_2(tmp_path):
    spec = f"{BROKEN}:BROKEN_OPERATIONS"
    done, mark = ninelives("sim", "smoke", "--profile", "smoke", "--seed", "1", "--engine",
                           spec, "--out", str(tmp_path / "out"), "--quiet")
    line = error_line(done)
    assert line == f"error: adapter {spec}: operations raised RuntimeError: " \
        f"{message('operations')}"
    assert carrying(mark) == []


def test_operations_the_vocabulary_cannot_read_end_the_run_with_exit_2_naming_the_field(
        tmp_path):
    """A claim without its step (chaos.engines.schema: required) is the adapter's error, named with
    the operation type, the field, an example and the method; never a checker's crash."""
    spec = f"{BROKEN}:UNREADABLE_OPERATIONS"
    line, out = run_broken(tmp_path, spec)
    assert line.startswith(f"error: adapter {spec}: operations(db): a 'claimed' operation "
                           "lacks 'step' (required: a string); operation "), line
    assert '"job": "doc-' in line  # the example operation
    assert_kept(line, out, "operations", raised="lacks 'step'")


def test_a_snapshot_the_harness_cannot_read_ends_the_run_with_exit_2_naming_the_field(
        tmp_path):
    spec = f"{BROKEN}:UNREADABLE_SNAPSHOT"
    line, out = run_broken(tmp_path, spec)
    assert line.startswith(f"error: adapter {spec}: snapshot(db): outbox[0] lacks 'key'"), line
    assert_kept(line, out, "snapshot", raised="lacks 'key'")


def test_evidence_left_out_makes_exactly_its_readers_unknown_naming_it(tmp_path):
    """A claim's lease_until left out (chaos.engines.schema: evidence): the checks that read it are
    unknown naming it, every other verdict stands, and the run is no adapter error."""
    out = tmp_path / "out"
    done, mark = ninelives("sim", "everything", "--seed", "1", "--engine",
                           f"{BROKEN}:LACKING_EVIDENCE", "--out", str(out), "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr
    assert carrying(mark) == []
    from chaos.checkers import READS, load
    load()
    readers = {name for name, items in READS.items() if "claimed.lease_until" in items}
    [report] = [json.loads(p.read_text()) for p in out.rglob("report.json")]
    verdicts = {v["name"]: v for v in report["verdicts"]}
    assert readers and readers <= set(verdicts)
    for name in readers:
        assert verdicts[name]["verdict"] == "unknown", name
        assert "claimed.lease_until (" in verdicts[name]["reason"], verdicts[name]["reason"]
    assert {verdicts[n]["verdict"] for n in set(verdicts) - readers} >= {"pass"}
