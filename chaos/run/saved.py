"""A saved run folder read back for `check`, `replay` and `report`: a finished run, or what
a run killed halfway left (report.json's start record, the plan and the scenario, the
runner's events, the ledgers, the engine's database), and a history file cut short.

A killed run has no history.jsonl and no snapshot.json: both are rebuilt from the sources
the run appended to as it went (`chaos.collect.collect_history`, the engine's rows). Its
verdicts, and a torn history's, are judged by `chaos.checkers.verdict.judge_incomplete`.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

from chaos.history import Event, Tear, load_history
from chaos.reports.render import readable_report

#: The verdicts' word for a history without its end (see SavedRun.incomplete).
PARTIAL, TORN = "partial run", "torn history"


@dataclass
class SavedRun:
    """A run folder's report, history and snapshot; `tear` where history.jsonl is cut
    short; `partial` when the run itself never reached its checks."""

    folder: str
    report: dict[str, Any]
    history: list[Event]
    snapshot: dict[str, Any]
    tear: Tear | None = None
    partial: bool = False

    def incomplete(self) -> str | None:
        """Why the history lacks its end, in a word ("torn history", "partial run"; the
        report says more), or None when it is whole."""
        if self.tear is not None:
            return TORN
        return PARTIAL if self.partial else None


def load_report(run: str) -> dict[str, Any]:
    """report.json of the run folder `run`, ready to render (a partial one marked so).
    Raises ValueError naming the file and what is wrong with it."""
    path = os.path.join(run, "report.json")
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise ValueError(f"{path} does not exist: is {run!r} a run folder?") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    return readable_report(data, path)


def load_json_object(path: str) -> dict[str, Any]:
    """The JSON object in `path`; raises ValueError naming the file if it is not one."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return data


def load_run(run: str) -> SavedRun:
    """The run folder `run` as the checkers read it. Raises ValueError naming the file at
    fault (a report, history or snapshot that cannot be read), OSError for a folder that
    cannot be."""
    report = load_report(run)
    partial = bool(report.get("partial"))
    history_path = os.path.join(run, "history.jsonl")
    snapshot_path = os.path.join(run, "snapshot.json")
    engine = None
    if os.path.exists(snapshot_path):
        snapshot = load_json_object(snapshot_path)
    elif partial:
        engine = _engine(report)
        snapshot = partial_snapshot(run, report, engine)
    else:
        raise ValueError(f"{snapshot_path} does not exist: the run's checks need it")
    if os.path.exists(history_path):
        end = (snapshot.get("phases") or {}).get("check_start")
        history, tear = load_history(history_path, end if isinstance(end, (int, float))
                                     else None)
    elif partial:
        from chaos.collect import collect_history
        engine = engine or _engine(report)
        from chaos.run.backends import saved_target
        history, tear = collect_history(run, engine, _recorded(run),
                                        saved_target(run, report)), None
    else:
        raise ValueError(f"{history_path} does not exist: the run's checks need it")
    return SavedRun(run, report, history, snapshot, tear, partial)


def keep_rebuilt(saved: SavedRun) -> None:
    """Write the history and snapshot of a partial run into its folder where it lacks them
    (atomically), so that `ninelives report` draws its timeline and charts."""
    from chaos.history import write_history
    from chaos.run.runfiles import write_json
    history = os.path.join(saved.folder, "history.jsonl")
    if not os.path.exists(history):
        write_history(f"{history}.tmp", saved.history)
        os.replace(f"{history}.tmp", history)
    snapshot = os.path.join(saved.folder, "snapshot.json")
    if not os.path.exists(snapshot):
        write_json(snapshot, saved.snapshot)


def _engine(report: dict[str, Any]) -> Any:
    from chaos.contract import load_engine
    return load_engine(report["engine"])


def _recorded(run: str) -> list[Event]:
    """The runner's own events (phases, lifecycle, nemesis), from events.jsonl."""
    from chaos.fakes import read_ledger
    return read_ledger(os.path.join(run, "events.jsonl"))


def partial_snapshot(run: str, report: dict[str, Any], engine: Any) -> dict[str, Any]:
    """The snapshot a killed run never wrote: the engine's rows as they stand in its
    database, and the harness's part from the report's start record (scenario, plan),
    the receiver's ledger (applied effects) and the runner's events (phases)."""
    from chaos.run.expect import harness_snapshot
    from chaos.fakes import read_ledger
    from chaos.spec.plan import FaultPlan
    from chaos.spec.scenario import check_saved
    from chaos.sim.shrink import scenario_from_json
    where = os.path.join(run, "report.json")
    try:
        scenario = check_saved(scenario_from_json(report["scenario"]), where)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{where}: its scenario cannot be read ({type(exc).__name__}: "
                         f"{exc})") from None
    plan = FaultPlan.from_json(report["plan"])
    settings = engine.settings(scenario.engine)
    from chaos.run.backends import saved_target
    snapshot = engine.snapshot(saved_target(run, report))
    applied, seen = [], Counter()
    for e in read_ledger(os.path.join(run, "receiver.jsonl")):
        if e.get("applied") and e.get("effect_id") and not seen[e["effect_id"]]:
            seen[e["effect_id"]] += 1
            applied.append({"id": e["effect_id"], "key": e.get("key"), "job": e.get("job"),
                            "kind": e.get("kind"), "t": e.get("t_start")})
    recorded = _recorded(run)
    phases = {f"{e['phase']}_start": e["t"] for e in recorded
              if e.get("src") == "runner" and e.get("type") == "phase"}
    # The jobs the runner got to submit before it was killed (or that are in the store: a
    # kill can fall between a submit and its record), not every job the plan meant to.
    submitted = {e.get("job") for e in recorded if e.get("src") == "runner"
                 and e.get("type") == "submit"} | set(snapshot.get("jobs") or {})
    snapshot.update(harness_snapshot(scenario, plan, engine, settings, integrity=[],
                                     receiver_applied=applied, phases=phases,
                                     jobs=[j for j in plan.jobs if j in submitted]))
    return snapshot
