"""Aimed faults: a fault fired at a named point of the engine, for a chosen job.

Random fault timing rarely lands in the narrow windows where lease bugs live (a zombie's
completion after another worker took its job over). An aim names the window instead: when a
process reaches `point` for the chosen job, it is *held* there (the thread blocked in the
probe, its process's other threads paused at their next point outside a transaction; a
simulated one parked) until the condition comes, its lease is *expired* before it goes on,
or it is *killed* there (the harness's SIGKILL, a crash at exactly that point). This module
owns the plain description (`Aim`, built from a scenario's `[[aim]]` tables or from code),
its validation, what it arms on one engine (`resolve`), the probe's environment for it, and
how its evidence reads (`aim_section`); `chaos.run.aim_watch` carries aims out in a real
run, `chaos.sim.aim` in a simulation.

    [[aim]]
    point = "role:after_call"     # where: an engine point or a role, '?' when optional
    action = "hold"               # "hold" (the default), "expire" or "kill"
    until = "takeover"            # "takeover", "point:NAME" (a rendezvous) or seconds
    job = "first"                 # "first", "pick" (the plan picks one), "held" (a job
                                  # another aim holds or held until its takeover), or an id
    step = ""                     # only while the job is at this step ("@last": its last;
                                  # at role:after_commit, the step that just committed)
    every = 1                     # the N-th, 2N-th ... matching pass of each process
    times = 1                     # how many holds in all
    deadline = 5.0                # a hold whose condition never comes ends here
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Iterable

from chaos import probe
from chaos.engines import crashpoints

ACTIONS = ("hold", "expire", "kill")
TAKEOVER = "takeover"
POINT = "point:"
JOB_CHOICES = ("first", "pick", "held")
LAST_STEP = "@last"
#: Roles whose points lie inside a write transaction: a process held there keeps the write
#: lock (no other worker could take its job over), and an expiry there would wait for that
#: very lock. An aim names the point before instead (role:after_call before role:before_commit).
IN_TRANSACTION = frozenset({"submit", "claim", "before_fail", "before_commit", "before_mark"})
#: Seconds an expiry waits for the write lock before the held process goes on anyway.
EXPIRE_WAIT = 2.0
#: What `until` waits for, as a sentence says it.
TAKEOVER_TEXT = "another process's claim of what it held"


@dataclass(frozen=True)
class Aim:
    """One aimed fault (see the module docstring). `check()` raises ValueError naming the
    field; `Aim.from_table` builds and checks one from a scenario's table."""

    point: str
    action: str = "hold"
    until: str | float = TAKEOVER
    job: str = "first"
    step: str = ""
    every: int = 1
    times: int = 1
    deadline: float = 5.0

    @classmethod
    def from_table(cls, raw: Any, index: int) -> "Aim":
        """The aim of a scenario's `[[aim]]` table number `index` (from 1). Raises ValueError
        naming the field (`aim[2].until`) and the reason."""
        name = f"aim[{index}]"
        if not isinstance(raw, dict):
            raise ValueError(f"{name} must be a table ({{point = ..., ...}})")
        known = {f.name for f in fields(cls)}
        for key in raw:
            if key not in known:
                raise ValueError(f"unknown field '{name}.{key}' (known: {', '.join(sorted(known))})")
        if "point" not in raw:
            raise ValueError(f"field '{name}.point' is required (a point name or role:NAME)")
        aim = cls(**raw)
        aim.check(name)
        return aim

    def check(self, name: str = "aim") -> None:
        """Raise ValueError naming the field of the first thing wrong."""
        def bad(field_name: str, what: str, value: Any) -> ValueError:
            return ValueError(f"field '{name}.{field_name}' must be {what}, got {value!r}")
        if not isinstance(self.point, str):
            raise bad("point", "a string", self.point)
        try:
            entry = crashpoints.parse(self.point)
        except ValueError as exc:
            raise ValueError(f"field '{name}.point': {exc}") from None
        if entry.point == crashpoints.ALL:
            raise bad("point", "one point or role, not '*'", self.point)
        if self.action not in ACTIONS:
            raise bad("action", " or ".join(repr(a) for a in ACTIONS), self.action)
        if entry.role in IN_TRANSACTION:
            raise ValueError(
                f"field '{name}.point': {self.point!r} is inside a write transaction (a "
                f"process held there keeps the write lock: no one could take its job over, "
                f"and an expiry would wait for that lock); aim at the point before it, such "
                f"as role:after_call")
        if isinstance(self.until, bool) or not isinstance(self.until, (str, int, float)):
            raise bad("until", f"{TAKEOVER!r}, 'point:NAME' or seconds", self.until)
        if isinstance(self.until, str):
            if self.until.startswith(POINT):
                try:
                    crashpoints.parse(self.until[len(POINT):])
                except ValueError as exc:
                    raise ValueError(f"field '{name}.until': {exc}") from None
            elif self.until != TAKEOVER:
                raise bad("until", f"{TAKEOVER!r}, 'point:NAME' or seconds", self.until)
        elif not 0 < self.until < float("inf"):
            raise bad("until", "a number of seconds above 0", self.until)
        if not isinstance(self.job, str) or not self.job:
            raise bad("job", f"one of {', '.join(JOB_CHOICES)} or a job id", self.job)
        if not isinstance(self.step, str):
            raise bad("step", "a step name or '@last'", self.step)
        for field_name in ("every", "times"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad(field_name, "a whole number >= 1", value)
        if isinstance(self.deadline, bool) or not isinstance(self.deadline, (int, float)) \
                or not 0 < self.deadline < float("inf"):
            raise bad("deadline", "a number of seconds above 0", self.deadline)
        if isinstance(self.until, (int, float)) and self.until > self.deadline:
            raise ValueError(f"field '{name}.until' ({self.until} s) exceeds "
                             f"{name}.deadline ({self.deadline} s)")

    @property
    def kind(self) -> str:
        """"takeover", "point" or "seconds": what releases a hold."""
        if isinstance(self.until, str):
            return "point" if self.until.startswith(POINT) else TAKEOVER
        return "seconds"

    @property
    def role(self) -> str | None:
        """The engine-neutral role its point is named by (`role:heartbeat` -> "heartbeat"),
        or None for an engine's own point name."""
        name = self.point.rstrip("?")
        return name[len("role:"):] if name.startswith("role:") else None

    @property
    def until_point(self) -> str | None:
        return self.until[len(POINT):] if self.kind == "point" else None

    def label(self, index: int) -> str:
        """How reports name the aim: `aim 1 (hold at role:after_call until takeover)`."""
        until = f"{self.until} s" if self.kind == "seconds" else str(self.until)
        what = {"hold": f"hold at {self.point} until {until}",
                "expire": f"expire at {self.point}"}.get(self.action, f"kill at {self.point}")
        return f"aim {index} ({what})"

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def waited_for(aim: Aim, job: str | None) -> str:
    """What a hold released at its deadline waited for in vain, as a sentence says it."""
    if aim.kind == "point":
        return f"no other process reached {aim.until_point} for {job}"
    return f"no {TAKEOVER_TEXT} ({job})"


def read_aims(raw: Any) -> tuple[Aim, ...]:
    """A scenario's `aim` array of tables. Raises ValueError naming the field."""
    if not isinstance(raw, list):
        raise ValueError("'aim' must be an array of tables ([[aim]])")
    return tuple(Aim.from_table(table, i) for i, table in enumerate(raw, 1))


@dataclass(frozen=True)
class Target:
    """What one aim arms on one engine: `points` (the engine's points it holds at),
    `watch` (those whose reaching releases it, a rendezvous), or why it does not apply
    (`absent`: optional, or the engine cannot; `missing`: a scenario error)."""

    index: int
    aim: Aim
    points: tuple[str, ...] = ()
    watch: tuple[str, ...] = ()
    absent: str = ""
    missing: str = ""

    @property
    def armed(self) -> bool:
        return bool(self.points) and not self.absent and not self.missing


def resolve(aims: Iterable[Aim], engine: Any) -> list[Target]:
    """Each aim's points on `engine` (an adapter), by name or role as crash points are."""
    caps = set(getattr(engine, "capabilities", ()))
    label = getattr(engine, "name", "?")
    targets = []
    for i, aim in enumerate(aims, 1):
        if "crash_points" not in caps:
            targets.append(Target(i, aim, absent=f"engine {label} has no crash points"))
            continue
        if aim.action == "expire" and "lease_expiry" not in caps:
            targets.append(Target(i, aim, absent=f"engine {label} has no lease_expiry control"))
            continue
        names = [aim.point] + ([aim.until_point] if aim.until_point else [])
        found = crashpoints.resolve(names, engine)
        gone = {**found.absent, **found.missing}
        why = "; ".join(f"{n!r}: {w}" for n, w in gone.items())
        points = found.named.get(aim.point, ())
        watch = found.named.get(aim.until_point, ()) if aim.until_point else ()
        targets.append(Target(i, aim, points, watch,
                              absent=why if gone and not found.missing else "",
                              missing=why if found.missing else ""))
    return targets


def job_filter(target: Target, plan: Any) -> str | None:
    """The job id the aim's process-side filter keeps, or None for any job. `plan` is the
    run's chaos.spec.plan.FaultPlan (not imported: the plan reads the scenario, which reads
    aims)."""
    job = target.aim.job
    if job == "pick":
        return plan.aimed_job(target.index)
    return None if job in JOB_CHOICES else job


def step_named(aim: Aim, pipeline: Any) -> str:
    """The step the aim's `step` names on `pipeline` ("" for any)."""
    if aim.step == LAST_STEP:
        return pipeline.steps[-1].name
    return aim.step


def step_at(aim: Aim, ops: list[dict], job: str, pipeline: Any) -> str | None:
    """The step `job` is at when a process reaches the aim's point, from the engine's
    operations: the step its last claim was for; at role:after_commit, the step whose
    completion it last wrote. The commit that completes a step may also claim the next one
    under the same lease, so the last claim there names the step after the one that just
    committed."""
    if aim.role != "after_commit":
        claims = [op for op in ops if op.get("type") == "claimed" and op.get("job") == job]
        return claims[-1].get("step") if claims else None
    done = {step.done: step.name for step in pipeline.steps}
    ends = [op for op in ops if op.get("type") == "state" and op.get("job") == job
            and op.get("to") in done]
    return done[ends[-1]["to"]] if ends else None


def pause_points(engine: Any) -> tuple[str, ...]:
    """The engine's points that play a role outside any write transaction: where the other
    threads of a process wait while one of its threads is held (the probe's
    NINELIVES_HOLD_PAUSE). A point of no role (one an engine passes inside its own batch,
    say) is never one: a thread paused there could keep a lock every other process waits
    for."""
    roles = crashpoints.point_roles(engine)
    inside = {p for role in IN_TRANSACTION for p in roles.get(role, ())}
    return tuple(dict.fromkeys(p for role, points in roles.items() if role not in IN_TRANSACTION
                               for p in points if p not in inside))


def probe_env(targets: Iterable[Target], plan: Any, log: str,
              engine: Any = None) -> dict[str, str]:
    """The probe's environment for the armed aims (see chaos.probe): NINELIVES_HOLD_AT,
    NINELIVES_HOLD_WATCH, NINELIVES_HOLD_PAUSE (`engine`'s `pause_points`) and
    NINELIVES_HOLD_LOG; {} when none is armed."""
    holds, watch = [], []
    for t in targets:
        if not t.armed:
            continue
        job = job_filter(t, plan)
        for p in t.points:
            holds.append(p + (f"={job}" if job else "") + (f"/{t.aim.every}" if t.aim.every > 1
                                                          else ""))
        watch += t.watch
    if not holds:
        return {}
    env = {"NINELIVES_HOLD_AT": ",".join(dict.fromkeys(holds)), "NINELIVES_HOLD_LOG": log}
    if watch:
        env["NINELIVES_HOLD_WATCH"] = ",".join(dict.fromkeys(watch))
    pause = pause_points(engine) if engine is not None else ()
    if pause:
        env["NINELIVES_HOLD_PAUSE"] = ",".join(pause)
    return env


def off_file(log: str) -> str:
    """The file whose presence disarms every probe writing to `log` (chaos.probe)."""
    return log + ".off"


def release_file(log: str, pid: int, hold: int) -> str:
    """The file whose creation releases hold number `hold` of process `pid` (chaos.probe)."""
    return probe.release_file(log, pid, hold)


@dataclass
class Taken:
    """Evidence that what a held process held was taken over: who claimed it, when."""

    by: str
    t: float
    pid: int | None = None


def held_claim(ops: list[dict], job: str, before: float, role: str,
               pid: int | None = None) -> dict | None:
    """The held process's last claim of `job` before `before`, of an outbox row when `role`
    is "sender": by its `pid` where the operations say who wrote, else the job's last
    claim (the held process holds the job's lease at the point)."""
    kind = "effect_claimed" if role == "sender" else "claimed"
    mine = [op for op in ops if op.get("type") == kind and op.get("job") == job
            and op["t"] <= before]
    own = [op for op in mine if pid is not None and op.get("pid") == pid]
    return (own or mine or [None])[-1]


def takeover(ops: list[dict], job: str, since: float, role: str,
             pid: int | None = None) -> Taken | None:
    """Another worker's (or sender's) claim of what the held process (`pid`) held, after
    `since`."""
    own = held_claim(ops, job, since, role, pid)
    kind = "effect_claimed" if role == "sender" else "claimed"
    for op in ops:
        if op.get("type") != kind or op.get("job") != job or op["t"] <= since:
            continue
        if kind == "claimed" and op.get("continued"):
            continue  # moving on under a lease held: no lease taken
        if own is not None and op.get("worker") == own.get("worker"):
            continue
        if kind == "effect_claimed" and own is not None and op.get("kind") != own.get("kind"):
            continue
        return Taken(str(op.get("worker") or "another process"), op["t"], op.get("pid"))
    return None


# -- the report ----------------------------------------------------------------------------

def sentences(events: list[dict]) -> dict[int, list[str]]:
    """aim index -> one sentence per time it fired, from its hold/release/expire events."""
    holds: dict[tuple[int, int], dict] = {}
    said: dict[int, list[str]] = {}
    for e in events:
        if e.get("src") != "nemesis" or "aim" not in e:
            continue
        i = e["aim"]
        if e["type"] == "hold":
            holds[(i, e.get("pid"))] = e
        elif e["type"] == "release":
            start = holds.pop((i, e.get("pid")), None)
            said.setdefault(i, []).append(_released(start or e, e))
        elif e["type"] == "expire":
            said.setdefault(i, []).append(_expired(e))
        elif e["type"] == "kill":
            said.setdefault(i, []).append(f"killed {e.get('target')} at {e.get('point')} for "
                                          f"{e.get('job')}")
    for (i, _), start in holds.items():
        said.setdefault(i, []).append(f"held {start.get('target')} at {start.get('point')} "
                                      f"for {start.get('job')}: never released in the record")
    return said


def _released(start: dict, end: dict) -> str:
    held = f"held {start.get('target')} at {start.get('point')} for {start.get('job')}"
    after = f"+{end['t'] - start['t']:.2f} s"
    reason = end.get("reason")
    if reason == TAKEOVER:
        seen = f"+{end['seen_t'] - start['t']:.2f} s" if end.get("seen_t") else after
        return f"{held} until {end.get('by')} claimed it at {seen}"
    if reason == "point":
        return f"{held} until {end.get('by')} reached {end.get('reached')} at {after}"
    if reason == "seconds":
        return f"{held} for {after}"
    if reason == "deadline":
        return (f"{held}: released at deadline ({after}), condition not met "
                f"({end.get('waited_for')})")
    return f"{held}: released at {after} ({reason})"


def _expired(e: dict) -> str:
    what = (f"expired {e.get('leases')} lease(s) when {e.get('target')} reached "
            f"{e.get('point')} for {e.get('job')}")
    return what + (f"; the expiry failed: {e['error']}" if e.get("error") else "")


def fired_counts(events: list[dict]) -> dict[int, int]:
    """aim index -> how often it fired (a hold begun, an expiry done, a kill)."""
    counts: dict[int, int] = {}
    for e in events:
        if e.get("src") == "nemesis" and "aim" in e and e["type"] in ("hold", "expire", "kill"):
            counts[e["aim"]] = counts.get(e["aim"], 0) + 1
    return counts


def aim_section(aims: Iterable[Aim], engine: Any, events: list[dict]) -> dict[str, Any]:
    """report.json's `aims`: per aim, its label, how often it fired and the evidence, or
    why it does not apply; and `aims_unfired`, the labels of applicable aims that never
    fired (a configured fault that never fired, as `faults_unfired`)."""
    said, counts = sentences(events), fired_counts(events)
    rows, unfired = [], []
    for t in resolve(aims, engine):
        label = t.aim.label(t.index)
        row = {"aim": label, "fired": counts.get(t.index, 0),
               "evidence": said.get(t.index, []), "not_applicable": t.absent or None}
        rows.append(row)
        if t.armed and not row["fired"]:
            unfired.append(label)
    return {"aims": rows, "aims_unfired": unfired}


def summary_lines(report: dict) -> list[str]:
    """The terminal summary's lines on the aimed faults (none when the scenario has none)."""
    lines = []
    for row in report.get("aims", ()):
        if row.get("not_applicable"):
            lines.append(f"{row['aim']}: not applicable: {row['not_applicable']}")
        elif not row["fired"]:
            lines.append(f"{row['aim']}: never fired")
        else:
            lines += [f"{row['aim']}: {s}" for s in row["evidence"]]
    return lines


def hold_log(run_dir: str) -> str:
    return os.path.join(run_dir, "holds.jsonl")
