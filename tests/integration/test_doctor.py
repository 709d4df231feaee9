"""`ninelives doctor`: ready adapters pass (exit 0), and an adapter with one requirement broken
(tests/integration/doctor_adapters.py) is not ready: exit 2, that gap named with its fix, no
other gap piled on, no traceback, and no process left behind."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from tests.marked import MARK, carrying

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BROKEN = "tests.integration.doctor_adapters"


def doctor(engine: str, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    """`ninelives doctor --engine ENGINE ARGS`, with a marker of its own in its environment;
    returns it and the marker (tests.marked.carrying finds what it left)."""
    mark = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith("NINELIVES_")}
    env[MARK] = mark
    done = subprocess.run([sys.executable, "-m", "chaos.commands.cli", "doctor", "--quiet", "--engine",
                           engine, *args], cwd=ROOT, text=True, capture_output=True,
                          timeout=120, env=env)
    return done, mark


def gap_lines(out: str) -> list[str]:
    return [line.strip() for line in out.splitlines() if line.strip().startswith("GAP ")]


@pytest.mark.parametrize("engine", [
    "reference", "examples.article_engine.adapter:ARTICLE", "examples.toy_engine.adapter:TOY",
    "examples.dbos_pipeline.adapter:DBOS_ENGINE", "examples.sqs_engine.adapter:SQS"])
def test_a_ready_adapter_passes(engine):
    done, mark = doctor(engine)
    assert done.returncode == 0, done.stdout + done.stderr
    assert gap_lines(done.stdout) == []
    assert "run: worker" in done.stdout and "jobs without faults" in done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith("ready for ninelives run: no gap")
    assert carrying(mark) == []


BROKEN_CASES = {
    "SUBMITTED_WITHOUT_STATE": ["'submitted' operations lack 'state', a required field",
                                "give every 'submitted' operation 'state' as a string"],
    "SENT_AT_AS_TEXT": ["the 'effect_sent' operation's 'sent_at' is str",
                        "give every 'effect_sent' operation 'sent_at' as seconds since the "
                        "epoch"],
    "UNORDERED_TOKENS": ["not increasing, while settings() says token_order='ordered'",
                         "declare token_order='opaque'"],
    "SUBMIT_NEEDS_SETTINGS": ["SUBMIT_NEEDS_SETTINGS: submit raised KeyError: 'settings'",
                              "submit takes **kwargs but no parameter named settings"],
    "ROLE_TO_UNDECLARED_POINT": ["maps role 'after_call' to 'after_the_call', which is not "
                                 "in its crashpoints", "Crash points by role"],
    "LOOP_POINT_UNDECLARED": ["crash_loop_point 'nowhere' is not among the crashpoints",
                              "set crash_loop_point to one of crashpoints"],
    "INTEGRITY_NOT_TEXT": ["'integrity' is declared but integrity: returned 0, not 'ok'",
                           "have integrity(db) return 'ok'"],
    "EXPIRE_ANSWERS_NONE": ["'lease_expiry' is declared but expire_leases: returned None, "
                            "not a count", "return how many (an int)"],
    "PROGRESS_RAISES": [f"adapter {BROKEN}:PROGRESS_RAISES: progress raised RuntimeError: "
                        "broken progress on purpose"],
    "ONE_COUNTER_AS_ATTEMPTS": ["'attempt_cap' is declared but settings() gives max_attempts "
                                "None", "cap_counts='claims' with max_claims",
                                "Mapping your engine's counters"],
    "ACCEPTS_ANY_SETTING": ["settings() accepts the unknown setting no_such_setting silently",
                            "raise ValueError naming any [engine] setting"],
}


@pytest.mark.parametrize("name", sorted(BROKEN_CASES))
def test_one_broken_requirement_is_one_named_gap(name):
    done, mark = doctor(f"{BROKEN}:{name}")
    assert done.returncode == 2, done.stdout + done.stderr
    for text in BROKEN_CASES[name]:
        assert text in done.stdout, done.stdout
    assert len(gap_lines(done.stdout)) == 1, done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith("not ready: 1 gap")
    assert "Traceback" not in done.stdout + done.stderr
    assert carrying(mark) == []


def test_evidence_left_out_is_a_warning_naming_the_checks_it_blinds():
    done, _ = doctor(f"{BROKEN}:LEASE_LEFT_OUT")
    assert done.returncode == 0, done.stdout + done.stderr
    warning = next(line for line in done.stdout.splitlines() if "claimed.lease_until" in line)
    assert warning.strip().startswith("warning") and "lease-exclusive" in warning
    assert "will be unknown" in warning


def test_a_short_heartbeat_is_exercised_and_seen():
    done, _ = doctor("reference", "--engine-set", "lease=2", "--engine-set",
                     "heartbeat_interval=0.3", "--engine-set", "call_timeout=1.5")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "lease renewal(s) marked heartbeat" in done.stdout


def test_json_says_the_same():
    done, _ = doctor(f"{BROKEN}:UNORDERED_TOKENS", "--json")
    assert done.returncode == 2, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ready"] is False and report["exit_code"] == 2
    gaps = [f for f in report["findings"] if f["level"] == "gap"]
    assert len(gaps) == 1 and "token_order='opaque'" in gaps[0]["fix"]


def test_an_adapter_that_cannot_be_loaded_is_named():
    done, _ = doctor("no_such_module:ADAPTER")
    assert done.returncode == 2
    assert "no_such_module" in gap_lines(done.stdout)[0]


def test_jobs_unfinished_at_the_deadline_are_one_gap_and_no_process_is_left():
    done, mark = doctor("examples.toy_engine.adapter:TOY", "--timeout", "0.01")
    assert done.returncode == 2, done.stdout + done.stderr
    assert gap_lines(done.stdout) == [
        next(line for line in gap_lines(done.stdout) if "did not finish within 0.01 s" in line)]
    assert carrying(mark) == []
