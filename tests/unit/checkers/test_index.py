"""The checkers' shared readings: built once for a history, never served for another."""
from __future__ import annotations

from builders import call, delivered_with_effects

from chaos.checkers.index import readings


def test_one_history_is_read_once_and_a_changed_one_again():
    history = delivered_with_effects("doc-1")
    first = readings(history)
    assert readings(history) is first and first.calls is first.calls
    history.append(call(9.0, 9.1, "doc-1", "fetch", "worker:host:109:zzzz"))
    again = readings(history)
    assert again is not first
    assert len(again.calls[("doc-1", "fetch")]) == len(first.calls[("doc-1", "fetch")]) + 1
    assert readings(list(history)) is not again  # an equal list is another history
