"""Dangerous situations a run reached ("sometimes" coverage), recognised from the history.

An invariant says what must always hold; a situation is a place worth reaching, where a
wrong engine would break one: a zombie's write after its lease was taken over, a step
finished from a memo left by a crashed worker, an outbox row taken from a sender still
alive. A pass means something only if the run reached the situations that could have broken
the invariant; one that reached none is reported as "pass, not exercised".

Everything here is engine-neutral and pure: a recogniser reads the history's vocabulary
(docs/history.md) and the final snapshot, and the checkers' shared readings
(chaos.checkers.index), never a process or a database.

The API (also used to steer exploration toward situations not reached yet):

  CATALOG     situation name -> one sentence: what it is and why it is dangerous
  EXERCISES   invariant name -> the situation names that exercise it (an invariant not
              listed guarantees something of every run, not of a dangerous situation: it
              is judged as before, and never "not exercised")
  recognise(history, snapshot) -> {name: Reached}, one per CATALOG entry:
              Reached.name, .count (how many times it was reached), .examples (up to
              MAX_EXAMPLES events, each the history's operation that shows one occurrence),
              .notes (a sentence per example), .lines (each example's line in
              history.jsonl, 1-based), .observable (False: this engine's evidence cannot
              show the situation) and .why (the reason, when not observable)
  exercise(verdicts, reached)  marks each passing verdict of an invariant in EXERCISES
              with `exercised` (whether any of its situations was reached) and
              `situations` ({name: count}, None for one not observable)
  summary_line(reached)  "situations reached: name x3, ...; not reached: ...; unobservable: ..."

A situation this engine's history cannot show is "unobservable" with the reason (no
provider ledger, no outbox leases, no heartbeat...), never a silent 0.
"""
from __future__ import annotations

from typing import Any

from chaos.history import Event
from chaos.situations import leases, work  # noqa: F401  (each registers its situations)
from chaos.situations.catalog import (CATALOG, EXERCISES, MAX_EXAMPLES, RECOGNISERS, Context,
                                      Reached, situation)

__all__ = ["CATALOG", "EXERCISES", "Reached", "exercise", "not_exercised", "recognise",
           "situation", "summary_line"]


# -- the API --------------------------------------------------------------------------------

_last: tuple[list[Event], int, dict[str, Any], dict[str, Reached]] | None = None


def recognise(history: list[Event], snapshot: dict[str, Any]) -> dict[str, Reached]:
    """Every situation of CATALOG, as reached (or not, or unobservable) in this run. The
    checkers, the report and exploration each ask of one history: the same, unchanged list
    with an equal snapshot gets the same answer, recognised once (as `readings` does)."""
    global _last
    if _last is not None and _last[0] is history and _last[1] == len(history) \
            and _last[2] == snapshot:
        return _last[3]
    out = _recognise(history, snapshot)
    _last = (history, len(history), dict(snapshot), out)
    return out


def _recognise(history: list[Event], snapshot: dict[str, Any]) -> dict[str, Reached]:
    out: dict[str, Reached] = {}
    if not history:
        return {name: Reached(name, observable=False, why="the history is empty")
                for name in CATALOG}
    try:
        ctx = Context(history, snapshot)
    except Exception as exc:  # a history the shared readings cannot read: no guess
        return {name: Reached(name, observable=False, why=f"the history could not be read "
                              f"({type(exc).__name__}: {exc})") for name in CATALOG}
    for name, recogniser in RECOGNISERS.items():
        reached = out[name] = Reached(name)
        try:
            found = recogniser(ctx)
        except Exception as exc:  # a broken recogniser must not abort a report
            reached.observable, reached.why = False, f"recogniser crashed: {exc!r}"
            continue
        if isinstance(found, str):
            reached.observable, reached.why = False, found
            continue
        reached.count = len(found)
        for event, note in found[:MAX_EXAMPLES]:
            reached.examples.append(event)
            reached.notes.append(note)
            reached.lines.append(ctx.pos.get(id(event), -1) + 1)
    return out


def exercise(verdicts: list, reached: dict[str, Reached]) -> list:
    """Mark each verdict of an invariant in EXERCISES: `situations` {name: count, None when
    unobservable}, and for a pass `exercised` (False: none of them was reached). Returns
    the verdicts."""
    for v in verdicts:
        needs = EXERCISES.get(v.name)
        if not needs:
            continue
        v.situations = {n: (reached[n].count if reached[n].observable else None)
                        for n in needs if n in reached}
        if v.valid is True:
            v.exercised = any(v.situations.values())
    return verdicts


def not_exercised(verdicts: list) -> list[str]:
    """The invariants that passed without any of their situations reached."""
    return [v.name for v in verdicts if v.valid is True and getattr(v, "exercised", None) is False]


def summary_line(reached: dict[str, Reached]) -> str:
    """One line: the situations reached with counts, those not reached, those unobservable."""
    hit = [f"{r.name} ×{r.count}" for r in reached.values() if r.count]
    missed = [r.name for r in reached.values() if r.observable and not r.count]
    blind = [r.name for r in reached.values() if not r.observable]
    line = "situations reached: " + (", ".join(hit) or "none")
    line += "; not reached: " + (", ".join(missed) or "none")
    if blind:
        line += "; unobservable: " + ", ".join(blind)
    return line
