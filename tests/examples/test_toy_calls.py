"""The toy engine's HTTP client against the fakes as real providers behave: a Retry-After
given as an HTTP date is honoured, one it cannot parse is no guidance, and a trickling hang
is given up at the call's deadline, not when the server stops sending."""
from __future__ import annotations

import email.utils
import time

import pytest

from chaos.fakes import FakeProvider, ScriptedFaults
from examples.toy_engine import calls


@pytest.mark.parametrize("header, now, wait", [
    ("2.5", None, 2.5),
    (email.utils.formatdate(1_000_004, usegmt=True), 1_000_001.25, 2.75),
    (email.utils.formatdate(1_000_000, usegmt=True), 1_000_001.25, 0.0),  # a date gone by
    ("soon", None, None), ("inf", None, None), (None, None, None),
])
def test_a_retry_after_in_seconds_or_as_an_http_date_is_the_wait(header, now, wait):
    error = calls.classify(429, header, now)
    assert isinstance(error, calls.Retryable) and error.retry_after == wait


def test_an_http_date_is_read_against_the_machines_clock_by_default():
    header = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 28 <= calls.classify(503, header).retry_after <= 30


def test_a_trickling_hang_is_given_up_at_the_calls_deadline(tmp_path):
    faults = ScriptedFaults(provider={("j", "summarize", 1): {
        "kind": "hang", "seconds": 1.6, "trickle": True}})
    with FakeProvider(tmp_path / "provider.jsonl", faults=faults) as provider:
        began = time.monotonic()
        with pytest.raises(calls.Retryable, match="TimeoutError"):
            calls.summarize(provider.url, "sk-test", "m", "j", "w", {"text": "a b"}, timeout=0.5)
        assert time.monotonic() - began < 0.5 + 0.4  # a byte came every 0.2 s all along
        output, _ = calls.summarize(provider.url, "sk-test", "m", "j", "w", {"text": "a b"},
                                    timeout=0.5)  # n=2 is not scripted: answered at once
    assert output["step"] == "summarize"
