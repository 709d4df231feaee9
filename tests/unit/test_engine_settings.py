"""The settings an adapter returns are checked when they are made, each wrong value named:
a lease of "2" or -1, a cap of 0, bounds whose lowest wait passes the highest or an unknown
claim order would otherwise make the checks misjudge every run without a word."""
from __future__ import annotations

import math

import pytest

from chaos.contract import EngineSettings


@pytest.mark.parametrize("field, value, words", [
    ("lease", -1.0, "lease must be a number of seconds above 0 or None, got -1.0"),
    ("lease", 0, "lease must be a number of seconds above 0"),
    ("lease", "2", "lease must be a number of seconds above 0 or None, got '2'"),
    ("heartbeat_interval", 0.0, "heartbeat_interval must be a number of seconds above 0"),
    ("call_timeout", True, "call_timeout must be a number of seconds above 0"),
    ("send_timeout", -0.5, "send_timeout must be a number of seconds above 0"),
    ("outbox_lease", math.nan, "outbox_lease must be a finite number"),
    ("claim_latency", -0.1, "claim_latency must be a number of seconds of at least 0"),
    ("finish_retry_slack", "0.5", "finish_retry_slack must be a number of seconds of at least 0"),
    ("max_attempts", 0, "max_attempts must be a whole number of at least 1 or None, got 0"),
    ("max_claims", 2.5, "max_claims must be a whole number of at least 1"),
    ("outbox_max_attempts", -3, "outbox_max_attempts must be a whole number of at least 1"),
    ("slots", 0, "slots must be a whole number of at least 1, got 0"),
    ("slots", None, "slots must be a whole number of at least 1, got None"),
    ("heartbeat", "yes", "heartbeat must be True or False, got 'yes'"),
    ("keep_job", 1, "keep_job must be True or False, got 1"),
    ("backoff_bounds", ((2.0, 1.0),), r"backoff_bounds\[0\] must be a \(lowest, highest\) pair"),
    ("backoff_bounds", ((0.1, 0.2), (0.5,)), r"backoff_bounds\[1\] must be a \(lowest, highest"),
    ("outbox_backoff_bounds", ((-0.1, 1.0),), r"outbox_backoff_bounds\[0\] must be a"),
    ("outbox_backoff_bounds", 0.5, "outbox_backoff_bounds must be a sequence of"),
    ("claim_order", "oldest", "claim_order must be 'due', 'due-unless-locked' or None, got "
                              "'oldest'"),
    ("lease_clock", "server", "lease_clock must be 'worker' or 'store'"),
])
def test_a_wrong_value_is_refused_naming_the_setting(field, value, words):
    with pytest.raises(ValueError, match=f"engine setting {words}"):
        EngineSettings(**{field: value})


def test_good_values_are_kept_and_bounds_made_tuples_of_seconds():
    settings = EngineSettings(lease=2, call_timeout=0.5, max_attempts=3, slots=4,
                              claim_latency=0, backoff_bounds=[[0, 1], (1, 2.5)],
                              claim_order="due-unless-locked")
    assert settings.backoff_bounds == ((0.0, 1.0), (1.0, 2.5))
    assert settings.backoff(2) == (1.0, 2.5) and settings.lease == 2 and settings.slots == 4
    assert hash(settings) == hash(EngineSettings(**{**settings.__dict__}))
