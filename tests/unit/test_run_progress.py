"""A run's progress lines: each phase, and what the drain still waits for, read from the
engine's own counts through the contract."""
from __future__ import annotations

import io
from types import SimpleNamespace

from chaos.reports.console import Progress
from chaos.run.runner import Campaign


def test_the_drain_line_says_what_the_drain_waits_for_from_the_engine_s_own_counts():
    pipeline = SimpleNamespace(terminal={"delivered", "cancelled"}, parked_states={"parked"})
    campaign = SimpleNamespace(engine=SimpleNamespace(pipeline=pipeline))
    out = io.StringIO()
    with Progress("drain", 50, unit="jobs settled", stream=out, every=0) as shown:
        Campaign._show(campaign, shown, {"states": {"delivered": 10, "parked": 3,
                                                    "pending": 37}, "unsent": 4},
                       until=0.0, drain=True)
    assert out.getvalue().splitlines()[0] == (
        "  drain: 13/50 jobs settled, 37 jobs not finished, 4 outbox rows unsent, "
        "0 s to the deadline")
