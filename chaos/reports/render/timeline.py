"""The timeline's content: one lane per worker or sender slot (its successive processes),
the steps each worker held, its provider calls and outbox sends, and the faults that hit it.

A process that runs several jobs at once (job slots) gets one row per job slot inside its
lane: each held step goes to the lowest row free at its claim, preferring the row its worker
id last used (`pack_rows`). The rows come from the holdings themselves, not from the engine's
worker ids or its settings, so an engine that writes every slot under one id is drawn alike,
and a lane has as many rows as its processes ever held jobs at once: one more than its slots
would show a process holding more jobs than it may.

Pure data from the history; `chaos.reports.render.svg` draws it. Long histories are thinned: beyond
`MAX_BARS` per lane and kind, bars are merged into time buckets, and `notes` says so.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from chaos.checkers.cuts import kill_cuts
from chaos.checkers.ops import is_job, is_worker, pids_by_worker, takes_lease
from chaos.history import Event
from chaos.reports.render.evidence import at, describe, event_key, writer_names

HARNESS = "harness"
MAX_BARS = 700      # per lane and kind; beyond that bars are merged into time buckets


@dataclass
class Segment:
    """One process's life in its lane."""
    name: str
    pid: int
    start: float
    end: float
    ended: str          # "SIGKILL", "exit 0", "running at the end", ...


@dataclass
class Lane:
    key: str
    role: str           # worker, sender, harness
    segments: list[Segment] = field(default_factory=list)
    rows: int = 1       # job slots drawn: the most steps its processes held at once


@dataclass
class Bar:
    """A held step (kind "step"), a provider call ("call") or a receiver request ("send")."""
    lane: str
    kind: str
    start: float
    end: float
    label: str          # the step, or the effect kind
    outcome: str
    title: str
    witness: str | None = None
    verdicts: tuple[str, ...] = ()
    merged: int = 1
    row: int = 0        # the job slot's row inside the lane (see pack_rows)
    worker: str | None = None
    job: str | None = None
    pid: int | None = None


@dataclass
class Mark:
    """A moment: a kill, a crash-point kill, a lease expiry, an operator action, a witness."""
    lane: str | None    # None: every lane (a forced lease expiry)
    kind: str
    t: float
    title: str
    witness: str | None = None
    verdicts: tuple[str, ...] = ()


@dataclass
class Band:
    """A span of time on a lane (a pause) or on the harness lane (an outage, contention)."""
    lane: str
    kind: str
    start: float
    end: float
    title: str


@dataclass
class Timeline:
    t0: float
    t1: float
    lanes: list[Lane]
    bars: list[Bar]
    marks: list[Mark]
    bands: list[Band]
    phases: list[tuple[str, float, float]]
    notes: list[str]


def build_timeline(history: list[Event], pipeline: dict[str, Any],
                   witnessed: dict[str, tuple[Event, list[str]]]) -> Timeline:
    """The timeline of a run: lanes, bars, marks and bands, witnesses flagged."""
    t0 = min((e["t"] for e in history), default=0.0)
    t1 = max((max(e["t"], e.get("t_end") or 0.0) for e in history), default=t0 + 1.0)
    lanes = Lanes(history, t0, t1)
    bars = held_steps(history, pipeline, lanes, t0, t1)
    calls = calls_and_sends(history, lanes, t0)
    pack_rows(bars, calls, lanes)
    bars += calls
    marks, bands = faults(history, lanes, t0, t1, cut_by(history, pipeline))
    marks += witness_marks(witnessed, lanes, t0, lanes.names)
    flag_witnesses(bars, witnessed)
    bars, notes = thin(bars, t0, t1)
    return Timeline(t0, max(t1, t0 + 1e-3), lanes.ordered(), bars, marks, bands,
                    phases(history, t1), notes)


class Lanes:
    """Slots as lanes (`worker-0` holds worker-0.1, worker-0.7, ...), and which lane a pid,
    a worker id or an event belongs to. A worker id is tied to its process by the engine
    operations that name both (ledger events carry only the id)."""

    def __init__(self, history: list[Event], t0: float, t1: float) -> None:
        self.by_key: dict[str, Lane] = {HARNESS: Lane(HARNESS, HARNESS)}
        self.by_pid: dict[int, str] = {}
        self.pids = pids_by_worker(history)
        self.role_of = {e["worker"]: e.get("actor") or "worker" for e in history
                        if e["src"] == "engine" and e.get("worker") in self.pids}
        self.names = writer_names(history)
        exits = {e["pid"]: e for e in history if e["src"] == "process" and e["type"] == "exit"}
        for e in history:
            if e["src"] == "process" and e["type"] == "spawn":
                key = str(e["name"]).rsplit(".", 1)[0]
                lane = self.by_key.setdefault(key, Lane(key, e.get("role", "worker")))
                end = exits.get(e["pid"])
                lane.segments.append(Segment(e["name"], e["pid"], e["t"],
                                             end["t"] if end else t1, _ended(end)))
                self.by_pid[e["pid"]] = key

    def of_pid(self, pid: int | None, role: str = "worker") -> str:
        if pid is None:
            return HARNESS
        if pid not in self.by_pid:  # no spawn event (a trimmed history): a lane of its own
            key = f"{role} pid {pid}"
            self.by_key.setdefault(key, Lane(key, role))
            self.by_pid[pid] = key
        return self.by_pid[pid]

    def of_worker(self, worker: str | None) -> str:
        worker = worker or ""
        return self.of_pid(self.pids.get(worker), self.role_of.get(worker, "worker"))

    def of_event(self, e: Event) -> str:
        if e["src"] in ("process", "nemesis") and e.get("pid") is not None:
            return self.of_pid(e["pid"], e.get("role", "worker"))
        if e["src"] == "engine" and e.get("pid") is not None:
            return self.of_pid(e["pid"], e.get("actor") or "worker")
        return self.of_worker(e.get("worker"))

    def ordered(self) -> list[Lane]:
        rank = {HARNESS: 0, "worker": 1, "sender": 2}
        return sorted(self.by_key.values(), key=lambda l: (rank.get(l.role, 3), _natural(l.key)))


def _natural(key: str) -> tuple:
    head, _, tail = key.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (key, 0)


def _ended(exit_event: Event | None) -> str:
    if exit_event is None:
        return "running at the end"
    if exit_event.get("signal"):
        return str(exit_event["signal"])
    return f"exit {exit_event.get('code')}"


# -- held steps -------------------------------------------------------------------------------

class _Held:
    """Each worker's open steps, one per job (a process with job slots holds several at
    once, under one worker id or one per slot)."""

    def __init__(self, pipeline: dict[str, Any], lanes: Lanes, t0: float) -> None:
        steps = pipeline.get("steps", [])
        self.step_of = {s["working"]: s["name"] for s in steps}
        self.done = {s["done"] for s in steps}
        self.ready = {s["ready"] for s in steps}
        self.parked = set(pipeline.get("parked", ()))
        self.lanes, self.t0 = lanes, t0
        self.open: dict[tuple[str, str], dict] = {}   # (worker, job) -> the open step
        self.last: dict[tuple[str, str], float] = {}
        self.bars: list[Bar] = []

    def job_write(self, e: Event) -> None:
        worker, job = e.get("worker"), e["job"]
        bar = self.open.get((worker, job))
        # A write that neither moves the job nor takes its lease (a heartbeat, a lease write)
        heartbeat = e["type"] == "state" and e.get("from") == e.get("to") and not takes_lease(e)
        if bar is not None and not heartbeat:
            self.close((worker, job), e["t"], self.outcome(e))
        if takes_lease(e):  # whoever else held the job lost it (or had walked away)
            for key in [k for k in self.open if k[1] == job and k[0] != worker]:
                self.lose(key, e["t"])
        if (e.get("to") in self.step_of and is_worker(e) and e.get("pid") is not None
                and not heartbeat):
            self.open[(worker, job)] = {"job": job, "step": e.get("step")
                                        or self.step_of[e["to"]], "start": e["t"],
                                        "pid": e["pid"]}

    def outcome(self, e: Event) -> str:
        to = e.get("to")
        if to in self.done or to in self.step_of:
            return "ok"
        return "retry" if to in self.ready else ("parked" if to in self.parked else str(to))

    def lose(self, key: tuple[str, str], t: float) -> None:
        """Another took the job's lease: the step ends at its holder's last activity on it."""
        bar = self.open[key]
        last = self.last.get(key, bar["start"])
        self.close(key, min(t, max(last, bar["start"])), "lost lease")

    def close(self, key: tuple[str, str], t: float, outcome: str) -> None:
        bar = self.open.pop(key)
        worker = key[0]
        title = (f"{bar['step']} of job {bar['job']} by {worker}: {at(bar['start'], self.t0)} "
                 f"to {at(t, self.t0)}, {outcome}")
        self.bars.append(Bar(self.lanes.of_pid(bar["pid"], self.lanes.role_of.get(
            worker, "worker")), "step", bar["start"], t, bar["step"], outcome, title,
            worker=worker, job=bar["job"], pid=bar["pid"]))

    def process_exit(self, e: Event) -> None:
        """Every step the process held ends with it (all its job slots at once)."""
        for key in [k for k, bar in self.open.items() if bar["pid"] == e.get("pid")]:
            self.close(key, e["t"], "killed" if e.get("signal") else "exited")


def held_steps(history: list[Event], pipeline: dict[str, Any], lanes: Lanes, t0: float,
               t1: float) -> list[Bar]:
    """Bars for the steps workers held: from entering a working state (a claim, or moving
    on in a kept job) to the worker's next write of that job, its process's death, or
    another's taking the job's lease."""
    held = _Held(pipeline, lanes, t0)
    for e in history:
        src, type_ = e["src"], e["type"]
        if is_job(e):
            held.job_write(e)
        elif src == "process" and type_ == "exit":
            held.process_exit(e)
        elif src in ("engine", "provider") and e.get("job") is not None:
            worker = e.get("worker")
            end = e.get("t_end") or e["t"]
            key = (worker, e["job"])
            held.last[key] = max(held.last.get(key, end), end)
    for key in list(held.open):
        held.close(key, t1, "unfinished")
    return held.bars


def pack_rows(steps: list[Bar], calls: list[Bar], lanes: Lanes) -> None:
    """Give each held step a row of its lane: the row its worker id used last if free at
    the step's start (an engine with one id per job slot keeps each slot on its own row),
    else the lowest free one; then each call the row of its worker's step on that job
    open at the call (row 0 without one). Sets each lane's `rows`."""
    by_lane: dict[str, list[Bar]] = defaultdict(list)
    for bar in steps:
        by_lane[bar.lane].append(bar)
    for lane, bars in by_lane.items():
        busy: list[float] = []          # row -> when its current step ends
        last_row: dict[str | None, int] = {}
        for bar in sorted(bars, key=lambda b: (b.start, b.end)):
            free = [r for r, until in enumerate(busy) if until <= bar.start]
            preferred = last_row.get(bar.worker)
            row = preferred if preferred in free else (free[0] if free else len(busy))
            if row == len(busy):
                busy.append(bar.end)
            busy[row] = max(bar.end, bar.start + 1e-9)
            bar.row, last_row[bar.worker] = row, row
        if lane in lanes.by_key:
            lanes.by_key[lane].rows = max(1, len(busy))
    open_steps: dict[tuple, list[Bar]] = defaultdict(list)
    for bar in steps:
        open_steps[(bar.worker, bar.job)].append(bar)
    for call in calls:
        holder = next((b for b in open_steps.get((call.worker, call.job), ())
                       if b.start - 0.005 <= call.start <= b.end + 0.005), None)
        call.row = holder.row if holder is not None else 0


def cut_by(history: list[Event], pipeline: dict[str, Any]) -> dict[int, list[dict]]:
    """pid -> the steps its death cut (chaos.checkers.cuts: those it was still working on),
    for the kill marks; the report's list of kills reads the same."""
    if not pipeline.get("steps"):
        return {}
    return {cut["pid"]: cut["steps"] for cut in kill_cuts(history, pipeline)}


def calls_and_sends(history: list[Event], lanes: Lanes, t0: float) -> list[Bar]:
    """Provider calls on their worker's lane, receiver requests on their sender's lane."""
    bars = []
    for e in history:
        if e["src"] == "provider" and e["type"] == "call":
            kind, label = "call", e.get("step", "?")
            outcome = "ok" if e.get("outcome") == "ok" else "error"
        elif e["src"] == "receiver" and e["type"] == "request":
            kind, label = "send", e.get("kind", "?")
            outcome = "ok" if e.get("outcome") in ("applied", "replayed") else "error"
        else:
            continue
        bars.append(Bar(lanes.of_worker(e.get("worker")), kind, e["t_start"],
                        e.get("t_end") or e["t_start"], str(label), outcome,
                        describe(e, t0, lanes.names),
                        witness=event_key(e), worker=e.get("worker"), job=e.get("job")))
    return bars


# -- faults -----------------------------------------------------------------------------------

MARKED = {("nemesis", "kill"): "kill", ("process", "crashpoint"): "crashpoint",
          ("nemesis", "operator"): "operator", ("nemesis", "duplicate_submit"): "submit"}
WINDOW_END = {"resume": "pause", "outage_end": "outage", "contention_end": "contention",
              "server_restart": "server_crash", "statement_timeout_end": "statement_timeout",
              "row_lock_end": "row_lock", "release": "hold"}


def faults(history: list[Event], lanes: Lanes, t0: float, t1: float,
           cut: dict[int, list[dict]] | None = None) -> tuple[list[Mark], list[Band]]:
    """Kills, crash-point kills (each saying the steps it cut: `cut`, see cut_by), operator
    actions and duplicate submits as marks; forced lease expiries across every lane;
    pauses, outages, contention, a database server down and a statement timeout's held
    lock as bands."""
    marks, bands, opened = [], [], {}
    for e in history:
        kind = MARKED.get((e["src"], e["type"]))
        if kind:
            lane = HARNESS if kind in ("operator", "submit") else lanes.of_event(e)
            text = describe(e, t0, lanes.names)
            if kind in ("kill", "crashpoint") and cut is not None and e.get("pid") is not None:
                text += _cut_text(cut.get(e["pid"], []))
            marks.append(Mark(lane, kind, e["t"], text))
        elif e["src"] != "nemesis":
            continue
        elif e["type"] == "expire":
            marks.append(Mark(None, "expire", e["t"], describe(e, t0, lanes.names)))
        elif e["type"] in WINDOW_END.values():
            opened[(e["type"], e.get("pid"), e.get("table"), e.get("row"))] = e
        elif e["type"] in WINDOW_END:
            start = opened.pop((WINDOW_END[e["type"]], e.get("pid"), e.get("table"),
                                e.get("row")), None)
            if start is not None:
                bands.append(_band(start, e["t"], lanes, t0))
    for start in opened.values():  # never healed: to its planned end, or the run's
        end = start["t"] + start["seconds"] if start.get("seconds") else t1
        bands.append(_band(start, min(end, t1), lanes, t0))
    return marks, bands


def _cut_text(steps: list[dict]) -> str:
    """What a kill's title adds: the steps its process was working on when it died."""
    if not steps:
        return "; it held no step"
    shown = ", ".join(f"{s['step']} of {s['job']}" for s in steps[:8])
    more = f" and {len(steps) - 8} more" if len(steps) > 8 else ""
    return f"; it cut {len(steps)} step{'s' if len(steps) != 1 else ''}: {shown}{more}"


def _band(start: Event, end: float, lanes: Lanes, t0: float) -> Band:
    kind = start["type"]
    lane = lanes.of_event(start) if kind in ("pause", "hold") else HARNESS
    what = {"pause": f"{start.get('target', 'process')} paused (SIGSTOP)",
            "hold": f"{start.get('target', 'process')} held at {start.get('point')} for "
                    f"{start.get('job')} (aimed fault {start.get('aim')}, SIGSTOP)",
            "outage": "provider outage", "contention": "database write lock held",
            "server_crash": "database server down (crashed, then restarted)",
            "statement_timeout": f"database write lock held until statements waited "
                                 f"{start.get('seconds')} s, then cancelled (statement "
                                 "timeout)",
            "row_lock": f"{'job' if start.get('table') == 'job' else 'outbox row of job'} "
                        f"{start.get('job')} held locked (SELECT ... FOR UPDATE)"}[kind]
    return Band(lane, kind, start["t"], end, f"{what}: {at(start['t'], t0)} to {at(end, t0)}")


def phases(history: list[Event], t1: float) -> list[tuple[str, float, float]]:
    """(phase, start, end) from the runner's phase events."""
    starts = [(e["phase"], e["t"]) for e in history
              if e["src"] == "runner" and e["type"] == "phase"]
    return [(name, t, starts[i + 1][1] if i + 1 < len(starts) else t1)
            for i, (name, t) in enumerate(starts)]


# -- witnesses --------------------------------------------------------------------------------

def witness_marks(witnessed: dict[str, tuple[Event, list[str]]], lanes: Lanes,
                  t0: float, names: dict[str, str] | None = None) -> list[Mark]:
    """A mark for every event that proves a violation, on the lane of whoever did it, in
    time order."""
    return sorted((Mark(lanes.of_event(e), "witness", e["t"],
                 f"witness of {', '.join(verdicts)}: {describe(e, t0, names)}", key,
                 tuple(verdicts))
            for key, (e, verdicts) in witnessed.items() if "t" in e), key=lambda m: m.t)


def flag_witnesses(bars: list[Bar], witnessed: dict[str, tuple[Event, list[str]]]) -> None:
    """Keep the witness key only on bars that are witnesses (and name their verdicts)."""
    for bar in bars:
        if bar.witness in witnessed:
            bar.verdicts = tuple(witnessed[bar.witness][1])
        else:
            bar.witness = None


def thin(bars: list[Bar], t0: float, t1: float,
         limit: int = MAX_BARS) -> tuple[list[Bar], list[str]]:
    """Merge each lane's bars of one kind into `limit` time buckets when there are more;
    witness bars stay whole. Returns the bars and a note per lane and kind thinned."""
    groups: dict[tuple[str, str, int], list[Bar]] = defaultdict(list)
    for bar in bars:
        groups[(bar.lane, bar.kind, bar.row)].append(bar)
    kept, notes = [], []
    for (lane, kind, row), group in groups.items():
        if len(group) <= limit:
            kept += group
            continue
        kept += [b for b in group if b.witness] + _merge(
            [b for b in group if not b.witness], t0, t1, limit)
        where = f"{lane} row {row + 1}" if row else lane
        notes.append(f"{where}: {len(group)} {kind} bars merged into at most {limit} time "
                     "buckets (the step drawn is the most frequent in each bucket)")
    return kept, notes


def _merge(bars: list[Bar], t0: float, t1: float, limit: int) -> list[Bar]:
    width = max(t1 - t0, 1e-9) / limit
    buckets: dict[int, list[Bar]] = defaultdict(list)
    for bar in bars:
        buckets[int((bar.start - t0) / width)].append(bar)
    merged = []
    for group in buckets.values():
        label = Counter(b.label for b in group).most_common(1)[0][0]
        outcomes = Counter(b.outcome for b in group)
        outcome = "ok" if outcomes.get("ok", 0) == len(group) else "mixed"
        title = (f"{len(group)} {group[0].kind}s merged: " +
                 ", ".join(f"{o} {n}" for o, n in outcomes.most_common()))
        merged.append(Bar(group[0].lane, group[0].kind, min(b.start for b in group),
                          max(b.end for b in group), label, outcome, title, merged=len(group),
                          row=group[0].row))
    return merged
