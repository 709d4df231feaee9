"""Swarm testing (Groce et al., ISSTA 2012): each seed runs its own mix of the scenario's faults.

A scenario that configures every fault at once runs every fault in every seed, so the
situations that need some faults *absent* (a zombie's write needs a lease that lapsed and
no kill that ends the zombie first) or one fault *dense* (several expiries in one step's
window) are rare. A swarm seed draws its own configuration from the scenario: each fault it
configures is left out with probability 1/2, and each fault kept runs at between half and
three times its rate or share; of the crash points the scenario arms, each is armed with
probability 1/2. Only faults the scenario configures take part: a swarm never adds one.

Random timing rarely lands in the narrow lease windows, so half the swarm seeds also aim
at one of them (`WINDOWS`): the aimed faults of one classic window (chaos.spec.aim), by role and
optional, added to the scenario's own. Only windows whose points the engine declares are
drawn; a hold's deadline is four of the scenario's leases, so another worker can take over.

The configuration is a pure function of (scenario, engine, seed), and the scenario it gives
is what the run records (`scenario.json`, a saved schedule), so a swarm seed replays
exactly: `ninelives sim SCENARIO --seed N --swarm` draws it again, `--replay` reads it back.

    spec = swarm_spec(SimSpec(scenario, 7, engine, "reference"))
    spec.swarm     # {"seed": 7, "off": [...], "scale": {...}, "points": [...]}
"""
from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

from chaos.spec import aim as aims
from chaos.engines import crashpoints
from chaos.spec.scenario import POSTGRES_FAULTS, RATES, SHARES, Scenario
from chaos.sim.spec import SimSpec

#: A kept fault runs at between these multiples of its configured rate or share.
LOWEST, HIGHEST = 0.5, 3.0
#: The chance that a swarm seed leaves out each configured fault, and each armed point.
LEAVE_OUT = 0.5
#: Shares of the documents that together may not pass this (as `chaos.spec.scenario` demands).
DOCUMENT_SHARES = ("poison", "crash_loop")
DOCUMENT_CAP = 0.5
#: Faults that are counts or windows: kept as configured, or left out.
WHOLE = ("skewed_workers", "heartbeat_off_workers", "latency")
#: The chance that a swarm seed aims at one lease window, and the windows: each the aims
#: (`[[aim]]` tables) of one, as the scenarios/aim-*.toml files aim at them.
AIMED = 0.5
_TAKEN = {"point": "role:after_call?", "until": aims.TAKEOVER, "job": "pick"}
_RESUMED = {"point": "role:after_claim?", "until": 0.5, "job": "held", "deadline": 1.0}
WINDOWS: dict[str, tuple[dict, ...]] = {
    "zombie-completion": (_TAKEN,),
    "zombie-heartbeat": ({"point": "role:heartbeat?", "until": aims.TAKEOVER, "job": "pick"},),
    "call-after-takeover": ({"point": "role:after_call?", "until": "point:role:after_claim",
                             "job": "pick"},),
    "commit-after-lapse": ({"point": "role:after_call?", "action": "expire", "job": "pick"},),
    "memo-resume": (_TAKEN, _RESUMED),
    "memo-resume-effects": ({**_TAKEN, "step": "@last"}, _RESUMED),
    "outbox-takeover": ({"point": "role:after_send?", "until": aims.TAKEOVER, "job": "pick"},),
}


def swarm_spec(spec: SimSpec) -> SimSpec:
    """`spec` with its seed's swarm configuration applied to its scenario and recorded in
    `spec.swarm` (a spec already swarmed is returned as it is)."""
    if spec.swarm is not None:
        return spec
    config = draw(spec.scenario, spec.engine, spec.seed)
    return dataclasses.replace(spec, scenario=apply(spec.scenario, config), swarm=config)


def draw(scenario: Scenario, engine: Any, seed: int) -> dict:
    """The swarm configuration of `seed` for `scenario` on `engine`: `off`, the faults left
    out; `scale`, each kept rate or share's multiplier; `outages`, the indexes of the outage
    windows kept; `points`, the crash points armed (None when the scenario arms none). At
    least one fault stays on when the scenario configures any."""
    rng = random.Random(f"ninelives.swarm:{scenario.name}:{seed}")
    f = scenario.faults
    graded = [name for name in (*RATES, *SHARES) if name not in POSTGRES_FAULTS
              and name != "crash_point_probability" and getattr(f, name) > 0]
    whole = [name for name in WHOLE if getattr(f, name)]
    windows = list(range(len(f.outages)))
    points = _armable(scenario, engine)
    present = graded + whole + [f"outages[{i}]" for i in windows] + (
        ["crash_points"] if points else [])
    off = {name for name in present if rng.random() < LEAVE_OUT}
    if present and off == set(present):
        off.discard(present[rng.randrange(len(present))])
    scale = {name: round(math.exp(rng.uniform(math.log(LOWEST), math.log(HIGHEST))), 3)
             for name in graded if name not in off}
    armed = None
    if points and "crash_points" not in off:
        armed = [p for p in points if rng.random() >= LEAVE_OUT] or [rng.choice(points)]
        scale["crash_point_probability"] = round(
            math.exp(rng.uniform(math.log(LOWEST), math.log(HIGHEST))), 3)
    aimable = _aimable(scenario, engine)
    window = rng.choice(aimable) if aimable and rng.random() < AIMED else None
    return {"seed": seed, "off": sorted(off), "scale": scale,
            "outages": [i for i in windows if f"outages[{i}]" not in off], "points": armed,
            "window": window}


def apply(scenario: Scenario, config: dict) -> Scenario:
    """`scenario` with the swarm configuration `config` (see `draw`) applied."""
    f, off, scale = scenario.faults, set(config["off"]), config["scale"]
    changes: dict[str, Any] = {}
    for name in (*RATES, *SHARES):
        if name in off:
            changes[name] = 0.0
        elif name in scale:
            value = getattr(f, name) * scale[name]
            changes[name] = min(1.0, value) if name in SHARES else value
    for name in WHOLE:
        if name in off:
            changes[name] = type(getattr(f, name))()
    changes["outages"] = tuple(w for i, w in enumerate(f.outages) if i in config["outages"])
    if config["points"] is None:
        changes["crash_points"], changes["crash_point_probability"] = (), 0.0
    else:
        changes["crash_points"] = tuple(config["points"])
    together = sum(changes.get(n, getattr(f, n)) for n in DOCUMENT_SHARES) + \
        scenario.run.needs_review
    if together > DOCUMENT_CAP:  # scaled up past what a scenario may ask: back to the cap
        room = max(0.0, DOCUMENT_CAP - scenario.run.needs_review)
        for name in DOCUMENT_SHARES:
            changes[name] = changes.get(name, getattr(f, name)) * room / (together -
                                                                       scenario.run.needs_review)
    aimed = _window_aims(scenario, config.get("window"))
    return dataclasses.replace(scenario, faults=dataclasses.replace(f, **changes),
                               aims=scenario.aims + aimed)


def _window_aims(scenario: Scenario, window: str | None) -> tuple[aims.Aim, ...]:
    """The aims of lease window `window` (None: none), numbered after the scenario's own."""
    if window is None:
        return ()
    lease = float(scenario.engine.get("lease") or 1.0)
    out = []
    for i, table in enumerate(WINDOWS[window], len(scenario.aims) + 1):
        out.append(aims.Aim.from_table({"deadline": max(5.0, 4 * lease), **table}, i))
    return tuple(out)


def _aimable(scenario: Scenario, engine: Any) -> list[str]:
    """The windows whose every aim the engine arms (its points declared, its controls
    there), in WINDOWS' order."""
    out = []
    for name in WINDOWS:
        try:
            targets = aims.resolve(_window_aims(scenario, name), engine)
        except ValueError:
            continue
        if targets and all(t.armed for t in targets):
            out.append(name)
    return out


def describe(config: dict) -> str:
    """The configuration in one line: what is off, what runs harder or softer."""
    scaled = ", ".join(f"{name} x{factor:.1f}" for name, factor in sorted(config["scale"].items()))
    off = ", ".join(config["off"]) or "nothing"
    points = "" if config["points"] is None else f"; points {len(config['points'])} armed"
    window = f"; aimed at {config['window']}" if config.get("window") else ""
    return (f"swarm seed {config['seed']}: off {off}; {scaled or 'no rate scaled'}{points}"
            f"{window}")


def _armable(scenario: Scenario, engine: Any) -> list[str]:
    """The engine's points the scenario arms, each by its own name ("*" spelt out)."""
    if not scenario.faults.crash_points or scenario.faults.crash_point_probability <= 0:
        return []
    armed = crashpoints.resolve(scenario.faults.crash_points, engine).armed
    if crashpoints.ALL in armed:
        return list(getattr(engine, "crashpoints", ()))
    return list(armed)
