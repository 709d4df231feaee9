"""The fault plan: a pure function of (scenario, seed), saved with the run.

The plan fixes which jobs exist and which of them are poison, crash-looping, flagged for
review or submitted twice; the nemesis timeline (when each kill, pause, expiry, contention
and operator action happens, and a number that picks its target); and the seed of the
provider and receiver fault functions, which decide per (job, step, n-th call) so the same
call gets the same fault whichever worker makes it.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from chaos.spec.documents import make_documents
from chaos.spec.latency import parse_latency
from chaos.pipeline import Pipeline
from chaos.spec.scenario import POSTGRES_FAULTS, Scenario

PLAN_VERSION = 1
POISON_KINDS = ("status400", "bad_content", "schema")


@dataclass
class FaultPlan:
    """Everything the run will do, decided before it starts."""

    seed: int
    scenario: str
    profile: str
    jobs: list[str]
    poison: dict[str, dict[str, str]]          # job -> {"step", "kind"}
    crash_loop: list[str]
    needs_review: list[str]
    duplicates: dict[str, list[str]]           # "same" / "different" -> jobs
    timeline: list[dict[str, Any]]             # {"at", "fault", "pick", ...}, sorted by "at"
    skewed: list[float]                        # clock offset per worker slot (0: none)
    crash_seeds: list[int] = field(default_factory=list)  # per spawn, for armed points
    forced_provider: list[list[str]] = field(default_factory=list)  # [job, step, fault]
    forced_receiver: list[list[str]] = field(default_factory=list)  # [job, kind, fault]
    #: job -> the step whose every call the model answers 503 (it parks at max_attempts)
    unavailable: dict[str, str] = field(default_factory=dict)
    declined: dict[str, str] = field(default_factory=dict)   # job -> the effect kind refused
    version: int = PLAN_VERSION

    def to_json(self) -> dict:
        return asdict(self)

    def aimed_job(self, index: int) -> str:
        """The job aim `index` with job = "pick" holds: a pure function of the seed."""
        return self.jobs[int(unit(self.seed, "aim", index) * len(self.jobs))]

    @classmethod
    def from_json(cls, data: dict) -> "FaultPlan":
        if data.get("version") != PLAN_VERSION:
            raise ValueError(f"fault plan version {data.get('version')} is not "
                             f"{PLAN_VERSION}; re-run the scenario instead of replaying")
        return cls(**data)


def _share(rng: random.Random, ids: list[str], share: float, taken: set[str]) -> list[str]:
    """About `share` of the ids (at least one when share > 0), not already taken."""
    if share <= 0:
        return []
    free = [i for i in ids if i not in taken]
    count = min(len(free), max(1, round(len(ids) * share)))
    picked = sorted(rng.sample(free, count))
    taken.update(picked)
    return picked


def _arrivals(rng: random.Random, rate: float, duration: float) -> list[float]:
    """Event times of a Poisson process of `rate` per second over [0, duration), with at
    least one event: a configured fault that never fires proves nothing."""
    times, t = [], 0.0
    if rate <= 0 or duration <= 0:
        return times
    while True:
        t += rng.expovariate(rate)
        at = round(t, 4)
        if at >= duration:  # rounding must not push an event past the chaos phase
            break
        times.append(at)
    return times or [min(round(rng.uniform(0, duration), 4), duration * 0.999)]


def make_plan(scenario: Scenario, seed: int, pipeline: Pipeline) -> FaultPlan:
    """The plan for `scenario` and `seed` on an engine with `pipeline` (its model steps are
    what poison and forced provider faults land on, its effect kinds what forced receiver
    faults land on). Pure: the same inputs give an equal plan."""
    rng = random.Random(f"plan:{scenario.name}:{scenario.profile}:{seed}")
    model_steps = pipeline.model_steps or tuple(s.name for s in pipeline.steps)
    run, f = scenario.run, scenario.faults
    jobs = [job_id for job_id, _ in make_documents(run.jobs, seed)]
    taken: set[str] = set()
    poison = {j: {"step": rng.choice(model_steps), "kind": rng.choice(POISON_KINDS)}
              for j in _share(rng, jobs, f.poison, taken)}
    crash_loop = _share(rng, jobs, f.crash_loop, taken)
    needs_review = _share(rng, jobs, run.needs_review, taken)
    unavailable = {j: rng.choice(model_steps) for j in _share(rng, jobs, f.unavailable, taken)}
    duplicates = {"same": _share(rng, jobs, f.duplicate_same, set()),
                  "different": _share(rng, jobs, f.duplicate_different, set())}
    timeline: list[dict[str, Any]] = []
    for fault in ("kill", "pause", "lease_expiry", "contention", "operator"):
        for at in _arrivals(rng, getattr(f, fault), run.chaos):
            event = {"at": at, "fault": fault, "pick": rng.randrange(1 << 30)}
            if fault == "operator":
                event["action"] = rng.choice(("cancel", "requeue", "resolve"))
            elif fault == "contention":
                event["seconds"] = hold_seconds(f, event["pick"])
            timeline.append(event)
    for i, (start, end) in enumerate(f.outages):
        timeline.append({"at": start, "fault": "outage", "pick": i, "until": end})
    for kind in ("same", "different"):
        for job in duplicates[kind]:
            timeline.append({"at": min(round(rng.uniform(0, run.chaos), 4), run.chaos * 0.999),
                             "fault": "duplicate_submit", "pick": 0, "job": job, "kind": kind})
    timeline.sort(key=lambda e: (e["at"], e["fault"], e["pick"]))
    skewed = [f.skew_seconds if i < f.skewed_workers else 0.0 for i in range(run.workers)]
    crash_seeds = [rng.randrange(1 << 30) for _ in range(64)]
    forced_provider, forced_receiver = _forced(rng, scenario, [j for j in jobs if j not in taken],
                                               model_steps[0], pipeline.effects)
    # Drawn last, so that a scenario without declined documents keeps the plan it had.
    declined = ({j: pipeline.effects[0] for j in _share(rng, jobs, f.declined, taken)}
                if pipeline.effects else {})
    # PostgreSQL's faults, after everything else and only when configured: every other
    # scenario keeps the plan (and the seeds) it had.
    for fault in POSTGRES_FAULTS:
        if getattr(f, fault):
            timeline += [{"at": at, "fault": fault, "pick": rng.randrange(1 << 30)}
                         for at in _arrivals(rng, getattr(f, fault), run.chaos)]
    if f.power_loss:  # last, and only when configured: every other plan stays as it was
        cuts = max(1, round(f.power_loss * run.chaos))
        timeline += [{"at": round((i + rng.uniform(0.25, 0.75)) * run.chaos / cuts, 4),
                      "fault": "power_loss", "pick": rng.randrange(1 << 30)}
                     for i in range(cuts)]
    timeline.sort(key=lambda e: (e["at"], e["fault"], e["pick"]))
    return FaultPlan(seed=seed, scenario=scenario.name, profile=scenario.profile, jobs=jobs,
                     poison=poison, crash_loop=crash_loop, needs_review=needs_review,
                     duplicates=duplicates, timeline=timeline, skewed=skewed,
                     crash_seeds=crash_seeds, forced_provider=forced_provider,
                     forced_receiver=forced_receiver, unavailable=unavailable,
                     declined=declined)


def hold_seconds(f, pick: int) -> float:
    """How long one contention fault holds the write lock: faults.contention_seconds, or
    drawn from [contention_seconds, contention_seconds_max] by the event's own pick (so that
    the plan's other draws stay as they were)."""
    if f.contention_seconds_max <= f.contention_seconds:
        return f.contention_seconds
    return round(random.Random(pick).uniform(f.contention_seconds, f.contention_seconds_max), 3)


#: The refusals a real provider answers a request it will never accept with: a poisoned
#: job's status is one of them, fixed per job, so that an engine that retries any 4xx above
#: 400 (or takes some for retryable) is seen.
POISON_STATUSES = (400, 404, 413, 422)


#: What a payments API answers a charge it declines for good (402 Payment Required).
DECLINED_STATUS = 402


def poison_status(plan: "FaultPlan", job: str) -> int:
    """The 4xx a poisoned job's calls are refused with (a pure function of the plan)."""
    return POISON_STATUSES[int(unit(plan.seed, "poison-status", job) * len(POISON_STATUSES))]


def unit(seed: int, *parts: object) -> float:
    """A uniform number in [0, 1) that depends only on the seed and the parts."""
    digest = hashlib.blake2b(":".join(map(str, (seed, *parts))).encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") / 2.0 ** 64


def _provider_faults(f, n: int) -> list[tuple[str, float, dict]]:
    """(name, share, fault) for the scenario's provider faults, in the order they are drawn."""
    return [
        ("provider_429", f.provider_429, {"kind": "status", "status": 429,
                                          "retry_after": f.retry_after if n % 2 else None}),
        ("provider_5xx", f.provider_5xx, {"kind": "status", "status": (500, 502, 503)[n % 3]}),
        ("hang", f.hang, {"kind": "hang", "seconds": f.hang_seconds}),
        ("reset", f.reset, {"kind": "reset"}),
        ("slow", f.slow, {"kind": "slow", "seconds": f.slow_seconds}),
    ]


def _receiver_faults(f, n: int) -> list[tuple[str, float, dict]]:
    return [
        ("receiver_5xx", f.receiver_5xx, {"kind": "status", "status": (500, 503)[n % 2]}),
        ("receiver_timeout", f.receiver_timeout, {"kind": "timeout", "seconds": 0.0}),
        ("receiver_drop", f.receiver_drop, {"kind": "drop"}),
        ("receiver_lost", f.receiver_lost, {"kind": "lost", "seconds": 0.0}),
    ]


#: The forms real providers give their faults, drawn per call apart from the fault itself
#: (so the faults a plan draws are the same with or without them): a share of the 429s
#: that carry Retry-After send it as an HTTP date (RFC 9110) instead of delta-seconds; a
#: share of the other 429s and of the 503s carry one no client can parse (a proxy's
#: "Retry-After: soon"); a share of the hangs trickle their answer a byte at a time.
RETRY_AFTER_DATE_SHARE = 0.5
RETRY_AFTER_JUNK_SHARE = 0.25
TRICKLE_SHARE = 0.5


def provider_form(plan: FaultPlan, job: str, step: str, n: int,
                  fault: dict | None) -> dict | None:
    """`fault` as a real provider gives it on the n-th call of (job, step): a pure function
    of the plan. Adds `retry_after_form` "date" (Retry-After as an HTTP date) or "junk" (an
    unparseable Retry-After) to a 429 or 503, `trickle` True to a hang; else returns it as
    it is."""
    if fault is None:
        return None
    u = unit(plan.seed, "form", job, step, n)
    if fault["kind"] == "status" and fault["status"] in (429, 503):
        if fault.get("retry_after") is not None:
            return {**fault, "retry_after_form": "date"} if u < RETRY_AFTER_DATE_SHARE else fault
        return {**fault, "retry_after_form": "junk"} if u < RETRY_AFTER_JUNK_SHARE else fault
    if fault["kind"] == "hang" and u < TRICKLE_SHARE:
        return {**fault, "trickle": True}
    return fault


def _draw(table: list[tuple[str, float, dict]], u: float) -> dict | None:
    for _, share, fault in table:
        if u < share:
            return fault
        u -= share
    return None


def document_fault(plan: FaultPlan, job: str, step: str) -> dict | None:
    """The fault a document brings to every call of one step, whatever else happens (it
    never heals): poison, or the 503 of an unavailable one; None for any other call."""
    poisoned = plan.poison.get(job)
    if poisoned and poisoned["step"] == step:
        kind = poisoned["kind"]
        return {"kind": "status", "status": poison_status(plan, job)} if kind == "status400" \
            else {"kind": kind}
    if plan.unavailable.get(job) == step:
        return {"kind": "status", "status": 503, "retry_after": None}
    return None


def receiver_document_fault(plan: FaultPlan, job: str, kind: str) -> dict | None:
    """The refusal a declined document's effect gets on every request (it never heals)."""
    if plan.declined.get(job) == kind:
        return {"kind": "status", "status": DECLINED_STATUS}
    return None


def provider_fault(scenario: Scenario, plan: FaultPlan, job: str, step: str,
                   n: int) -> dict | None:
    """The fault for the n-th call of (job, step): a pure function of the plan.

    Poison and unavailable jobs fail their step every time (document_fault); the plan's
    forced calls get their fault (so every configured fault fires, however small the run);
    other calls draw one number and walk the cumulative shares of the scenario's provider
    faults. Each fault comes in the form the call draws apart (provider_form).
    """
    own = document_fault(plan, job, step)
    if own is not None:
        return provider_form(plan, job, step, n, own)
    table = _provider_faults(scenario.faults, n)
    fault = forced(table, plan.forced_provider, job, step, n) or _draw(
        table, unit(plan.seed, "provider", job, step, n))
    return provider_form(plan, job, step, n, fault) or latency_fault(scenario, plan, job, step, n)


def latency_fault(scenario: Scenario, plan: FaultPlan, job: str, step: str,
                  n: int) -> dict | None:
    """The call's latency from the scenario's distribution, as a slow answer (or None).

    Latency is the provider's nature, not a fault: it stays after the heal."""
    if not scenario.faults.latency:
        return None
    seconds = parse_latency(scenario.faults.latency).quantile(
        unit(plan.seed, "latency", job, step, n))
    return {"kind": "slow", "seconds": round(seconds, 4)}


def forced(table: list[tuple[str, float, dict]], forced_calls: list[list[str]], job: str,
           what: str, n: int) -> dict | None:
    """The fault the plan forces on the first call of (job, step or kind), if any; an entry
    [job, what, name, "trickle"] forces a hang in its trickling form."""
    if n == 1:
        for forced_job, forced_what, name, *form in forced_calls:
            if (forced_job, forced_what) == (job, what):
                fault = next(fault for key, _, fault in table if key == name)
                return {**fault, "trickle": True} if form == ["trickle"] else fault
    return None


def forced_provider_fault(scenario: Scenario, plan: FaultPlan, job: str, step: str,
                          n: int) -> dict | None:
    return provider_form(plan, job, step, n, forced(_provider_faults(scenario.faults, n),
                                                    plan.forced_provider, job, step, n))


def forced_receiver_fault(scenario: Scenario, plan: FaultPlan, job: str, kind: str,
                          n: int) -> dict | None:
    return forced(_receiver_faults(scenario.faults, n), plan.forced_receiver, job, kind, n)


def receiver_fault(scenario: Scenario, plan: FaultPlan, job: str, kind: str,
                   n: int) -> dict | None:
    """The fault for the n-th request of (job, kind): a pure function of the plan. A
    declined document's effect is refused every time (receiver_document_fault)."""
    own = receiver_document_fault(plan, job, kind)
    if own is not None:
        return own
    table = _receiver_faults(scenario.faults, n)
    return forced(table, plan.forced_receiver, job, kind, n) or _draw(
        table, unit(plan.seed, "receiver", job, kind, n))


def _forced(rng: random.Random, scenario: Scenario, clean: list[str], first_step: str,
            effects: tuple[str, ...]) -> tuple[list, list]:
    """One call per configured share fault that is sure to get it: (job, step|kind, fault).

    They land on the first calls of the earliest clean jobs, which workers take first, so
    they happen early in the chaos phase however short it is or however loaded the machine.
    """
    f = scenario.faults
    provider = [[name] for name, share, _ in _provider_faults(f, 1) if share > 0]
    if f.hang > 0:
        # A hang comes in two forms that a client's deadline must both cut short: silence,
        # and an answer trickled a byte at a time (which resets every socket timeout).
        provider.append(["hang", "trickle"])
    receiver = [name for name, share, _ in _receiver_faults(f, 1) if share > 0] if effects else []
    early = clean[:max(len(provider), len(receiver))]
    return ([[j, first_step, *name] for j, name in zip(early, provider)],
            [[j, rng.choice(effects), name] for j, name in zip(early, receiver)])


def documents_for(plan: FaultPlan) -> list[tuple[str, dict]]:
    """The plan's documents; jobs flagged for review carry the marker the model reacts to."""
    flagged = set(plan.needs_review)
    docs = []
    for job_id, payload in make_documents(len(plan.jobs), plan.seed):
        if job_id in flagged:
            payload = {**payload, "title": payload["title"] + " [[needs-review]]"}
        docs.append((job_id, payload))
    return docs
