"""A campaign: the verdicts of many runs of one scenario (`sim --seeds`, `run --seeds`,
`explore`, one shard of any of them, or the shards merged), kept as one record.

`campaign.json` (schema "ninelives.campaign/1") is written in the command's `--out` folder,
beside `summary.md`, `junit.xml` and `report.html` rendered from it (chaos.reports.render.campaign).
It holds, per invariant, how many runs passed (exercised, or of an invariant that declares
no situations), passed not exercised, failed, had no evidence (unknown) or whose checker
crashed, the failing seeds and the first reason (of the lowest seed); the situations
reached, summed over the runs; every failing seed with its run folder (relative to the
record's own folder) and the commands that rerun and replay it; the runs that ended in error. Every count is a sum, so the record of N
shards merged (`Tally.absorb`) equals the record of the unsharded campaign.

A campaign's verdict per invariant: fail when any run failed it; else pass when any run
passed it exercised; else "pass, not exercised" when some run passed it; else unknown. Its
exit code: 1 when an invariant failed; else 2 when a run ended in error (a checker crashed,
a configured fault never fired in a real run), when no invariant had evidence, or when no
run ran; else 0.
"""
from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any, Iterable

from chaos.reports.report import RESULTS
from chaos.run.runfiles import write_json
from chaos.run.shards import WHOLE, Shard

CAMPAIGN_SCHEMA = "ninelives.campaign/1"
CAMPAIGN_FILE = "campaign.json"
#: The rule that says which shard a seed belongs to (chaos.run.shards), as the record states it.
SHARD_RULE = "seed s of A..B belongs to shard I of N when (s - A) % N == I - 1"
COUNTS = ("pass", "not_exercised", "fail", "unknown", "crashed")


def _entry() -> dict[str, Any]:
    return {**{k: 0 for k in COUNTS}, "errors": 0, "declares_situations": False,
            "failing_seeds": [], "reason": "", "reason_seed": None, "reason_kind": None}


class Tally:
    """The verdicts of a campaign's runs, added one run at a time (`add`) or a whole shard's
    at once (`absorb`)."""

    def __init__(self, list_seeds: bool = True) -> None:
        self.invariants: dict[str, dict[str, Any]] = {}
        self.situations: dict[str, dict[str, Any]] = {}
        self.results: Counter = Counter()
        self.failing: list[dict[str, Any]] = []
        self.errors: list[dict[str, Any]] = []
        self.seeds: list[int] | None = [] if list_seeds else None
        self.runs = 0

    def add(self, seed: int, verdicts: Iterable[dict], reached: dict | None, exit_code: int,
            **failing: Any) -> None:
        """One run: its verdicts (report.json's shape), the situations it reached
        ({name: chaos.situations.Reached}) and its exit code; `failing` (run_dir, rerun,
        replay, ...) is kept for a run that failed, or with `why` for one in error."""
        self.runs += 1
        if self.seeds is not None:
            self.seeds.append(seed)
        verdicts = list(verdicts)
        for v in verdicts:
            self._verdict(seed, v)
        for name, r in (reached or {}).items():
            s = self.situations.setdefault(name, {"count": 0, "runs": 0, "unobservable": 0,
                                                  "why": ""})
            if not r.observable:
                s["unobservable"] += 1
                s["why"] = s["why"] or r.why
            elif r.count:
                s["count"] += r.count
                s["runs"] += 1
        self.results[RESULTS.get(exit_code, "error")] += 1
        failed = sorted(v["name"] for v in verdicts if v["verdict"] == "fail")
        if failed:
            self.failing.append({"seed": seed, "invariants": failed, **failing})
        elif exit_code != 0:
            crashed = [v["name"] for v in verdicts if "traceback" in (v.get("metrics") or {})]
            why = failing.pop("why", None) or (f"checker crashed: {', '.join(crashed)}"
                                               if crashed else "the run ended in error")
            self.errors.append({"seed": seed, "why": why, **failing})

    def _verdict(self, seed: int, v: dict) -> None:
        e = self.invariants.setdefault(v["name"], _entry())
        declares = v.get("situations") is not None
        e["declares_situations"] |= declares
        kind = v["verdict"]
        if kind == "pass":
            e["not_exercised" if v.get("exercised") is False else "pass"] += 1
        else:
            e[kind] += 1
        if "traceback" in (v.get("metrics") or {}):
            e["crashed"] += 1
        e["errors"] += int(v.get("error_count") or 0)
        if kind == "fail":
            e["failing_seeds"].append(seed)
        if kind in ("fail", "unknown") and v.get("reason"):
            _keep_reason(e, kind, seed, v["reason"])

    def absorb(self, other: "Tally") -> None:
        """Add every run of `other` (a shard's tally) to this one."""
        self.runs += other.runs
        if self.seeds is not None and other.seeds is not None:
            self.seeds = sorted(self.seeds + other.seeds)
        else:
            self.seeds = None
        for name, o in other.invariants.items():
            e = self.invariants.setdefault(name, _entry())
            for k in (*COUNTS, "errors"):
                e[k] += o[k]
            e["declares_situations"] |= o["declares_situations"]
            e["failing_seeds"] = sorted(e["failing_seeds"] + o["failing_seeds"])
            if o["reason_kind"]:
                _keep_reason(e, o["reason_kind"], o["reason_seed"], o["reason"])
        for name, o in other.situations.items():
            s = self.situations.setdefault(name, {"count": 0, "runs": 0, "unobservable": 0,
                                                  "why": ""})
            for k in ("count", "runs", "unobservable"):
                s[k] += o[k]
            s["why"] = s["why"] or o["why"]
        self.results.update(other.results)
        self.failing = sorted(self.failing + other.failing, key=lambda f: f["seed"])
        self.errors = sorted(self.errors + other.errors, key=lambda f: f["seed"])

    # -- the verdicts ---------------------------------------------------------------------

    def verdicts(self) -> dict[str, dict[str, Any]]:
        """invariant -> its counts with the campaign's `verdict` and `exercised` (None for
        an invariant that declares no situations)."""
        out = {}
        for name, e in self.invariants.items():
            if e["fail"]:
                verdict, exercised = "fail", None
            elif e["pass"]:
                verdict, exercised = "pass", True
            elif e["not_exercised"]:
                verdict, exercised = "pass", False
            else:
                verdict, exercised = "unknown", None
            out[name] = {**e, "verdict": verdict,
                         "exercised": exercised if e["declares_situations"] else None}
        return out

    def exit_code(self) -> int:
        verdicts = self.verdicts().values()
        if any(v["verdict"] == "fail" for v in verdicts):
            return 1
        if not self.runs or self.results["error"] or \
                all(v["verdict"] == "unknown" for v in verdicts):
            return 2
        return 0

    def to_json(self) -> dict[str, Any]:
        code = self.exit_code()
        return {"runs": self.runs, "seeds": self.seeds, "results": dict(self.results),
                "invariants": self.verdicts(), "situations": self.situations,
                "not_exercised": sorted(n for n, v in self.verdicts().items()
                                        if v["verdict"] == "pass" and v["exercised"] is False),
                "failing": self.failing, "errors": self.errors,
                "result": RESULTS[code], "exit_code": code}

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> "Tally":
        """The tally a campaign.json holds (`record`); raises KeyError or TypeError for a
        record without one."""
        tally = cls(list_seeds=record["seeds"] is not None)
        tally.runs = int(record["runs"])
        tally.seeds = None if record["seeds"] is None else [int(s) for s in record["seeds"]]
        tally.results = Counter(record["results"])
        for name, v in record["invariants"].items():
            tally.invariants[name] = {k: v[k] for k in _entry()}
        tally.situations = {n: dict(s) for n, s in record["situations"].items()}
        tally.failing = list(record["failing"])
        tally.errors = list(record["errors"])
        return tally


def _keep_reason(e: dict, kind: str, seed: int, reason: str) -> None:
    """Keep the reason of the lowest seed among the failures, else among the unknowns: the
    same whichever shard or order the runs came in."""
    rank = (0 if kind == "fail" else 1, seed)
    if e["reason_kind"] is None or rank < (0 if e["reason_kind"] == "fail" else 1,
                                           e["reason_seed"]):
        e.update(reason=reason, reason_seed=seed, reason_kind=kind)


# -- the record on disk -------------------------------------------------------------------

def campaign_key(command: str, scenario: Any, engine_spec: str, **more: Any) -> dict[str, Any]:
    """What every shard of one campaign shares (merge refuses shards that differ in it):
    the command, the scenario (name and file), its profile, the engine and its settings
    given on the command line, and `more` (the seeds, swarm, the explorer's seed...)."""
    return {"command": command, "scenario": scenario.name,
            "scenario_path": os.path.relpath(scenario.path), "profile": scenario.profile,
            "engine": engine_spec or "reference",
            "engine_set": dict(sorted((scenario.engine_set or {}).items())), **more}


def campaign_record(key: dict[str, Any], tally: Tally, shards: Iterable[Shard] = (WHOLE,),
                    started: float | None = None, **more: Any) -> dict[str, Any]:
    """campaign.json's content: the key, the shards it holds and the tally."""
    shards = sorted(shards, key=lambda s: s.index)
    return {"schema": CAMPAIGN_SCHEMA, "key": key,
            "shards": {"count": shards[0].count, "given": [s.index for s in shards],
                       "rule": SHARD_RULE},
            "started": started, "finished": time.time(), **more, **tally.to_json()}


def write_campaign(folder: str, record: dict[str, Any]) -> list[str]:
    """Write campaign.json into `folder` (made if need be), then summary.md, junit.xml and
    report.html from it (a rendering failure is a warning: campaign.json stays); returns
    the paths written."""
    os.makedirs(folder, exist_ok=True)
    paths = [write_json(os.path.join(folder, CAMPAIGN_FILE), record)]
    try:
        from chaos.reports.render.campaign import render_campaign
        paths += render_campaign(folder, record)
    except Exception as exc:  # noqa: BLE001 - the record is what matters
        print(f"warning: the campaign's pages could not be rendered: "
              f"{type(exc).__name__}: {exc}", flush=True)
    return paths


def campaign_lines(record: dict[str, Any], folder: str) -> list[str]:
    """What a command prints after a campaign: one line per failing invariant, the result
    and where the record is."""
    lines = []
    for name, v in record["invariants"].items():
        if v["verdict"] == "fail":
            lines.append(f"  {name}: failed in {v['fail']} of {record['runs']} runs (seeds "
                         f"{_seeds(v['failing_seeds'])}): {v['reason'][:160]}")
    if record["not_exercised"]:
        lines.append(f"  passed, not exercised in any run: {', '.join(record['not_exercised'])}")
    shards = record["shards"]
    part = "" if shards["count"] == 1 else f" ({shards['count']} shards merged)" \
        if len(shards["given"]) == shards["count"] else \
        f" (shard {', '.join(map(str, shards['given']))} of {shards['count']})"
    lines.append(f"campaign{part}: {record['runs']} runs, {record['result'].upper()}; "
                 f"{os.path.join(folder, CAMPAIGN_FILE)}, {os.path.join(folder, 'summary.md')}")
    return lines


def _seeds(seeds: list[int], most: int = 10) -> str:
    shown = ", ".join(map(str, seeds[:most]))
    return shown + (f" and {len(seeds) - most} more" if len(seeds) > most else "")
