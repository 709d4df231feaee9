"""The fault plan: a pure function of (scenario, seed) that survives JSON; its timeline, job
picks and duplicates follow the scenario; provider and receiver faults are pure functions of
(seed, job, step, n) whose frequencies match the scenario's shares, in the forms real
providers give them (Retry-After as an HTTP date or junk, trickling hangs); poison stays on
its step; and the FaultPolicy the fakes consult (outage switch, heal, receiver timeouts)."""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
from collections import Counter

import pytest

from chaos.spec.documents import make_documents
from chaos.run.nemesis import FaultPolicy
from chaos.spec.plan import (POISON_KINDS, POISON_STATUSES, RETRY_AFTER_DATE_SHARE,
                        RETRY_AFTER_JUNK_SHARE, TRICKLE_SHARE, FaultPlan, documents_for,
                        make_plan, poison_status, provider_fault, receiver_fault)
from chaos.reference import REFERENCE
from chaos.spec.scenario import RATES, SCENARIO_DIR, load_scenario

PIPELINE = REFERENCE.pipeline
MODEL_STEPS = PIPELINE.model_steps

SHIPPED = sorted(p.stem for p in pathlib.Path(SCENARIO_DIR).glob("*.toml")
                 if p.name != "profiles.toml")
EFFECT_KINDS = ("charge", "notify")
MARKER = "[[needs-review]]"


@functools.lru_cache(maxsize=None)
def scenario(name: str, profile: str = "ci"):
    return load_scenario(name, profile)


@functools.lru_cache(maxsize=None)
def plan(name: str, seed: int = 1, profile: str = "ci") -> FaultPlan:
    """A cached plan: tests only read it."""
    return make_plan(scenario(name, profile), seed, PIPELINE)


def with_changes(name: str, run: dict | None = None, faults: dict | None = None):
    s = scenario(name)
    return dataclasses.replace(s, run=dataclasses.replace(s.run, **(run or {})),
                               faults=dataclasses.replace(s.faults, **(faults or {})))


def poison_fault_for(p: FaultPlan, job: str, step: str) -> dict | None:
    """The fault a poisoned or unavailable (job, step) must get on every call, else None."""
    poisoned = p.poison.get(job)
    if p.unavailable.get(job) == step:
        return {"kind": "status", "status": 503, "retry_after": None}
    if not poisoned or poisoned["step"] != step:
        return None
    if poisoned["kind"] == "status400":
        return {"kind": "status", "status": poison_status(p, job)}
    return {"kind": poisoned["kind"]}


FORMS = ("retry_after_form", "trickle")


def formless(fault: dict | None) -> dict | None:
    """The fault without the form a call gives it (provider_form)."""
    return None if fault is None else {k: v for k, v in fault.items() if k not in FORMS}


def is_poison(fault: dict | None) -> bool:
    return bool(fault) and (fault.get("status") in POISON_STATUSES
                            or fault["kind"] in ("bad_content", "schema", "garbage"))


def provider_calls(p: FaultPlan, calls: int = 20):
    return [(job, step, n) for job in p.jobs for step in MODEL_STEPS
            for n in range(1, calls + 1)]


def differences(pairs, limit: int = 5) -> list:
    """The first (call, got, expected) triples that disagree."""
    return [(call, got, want) for call, got, want in pairs if got != want][:limit]


# -- purity and serialization ---------------------------------------------------------------

@pytest.mark.parametrize("name", SHIPPED)
def test_the_same_scenario_and_seed_give_an_equal_plan(name):
    first = make_plan(scenario(name), 11, PIPELINE).to_json()
    again = make_plan(load_scenario(name), 11, PIPELINE).to_json()
    assert first == again
    assert json.dumps(first, sort_keys=True) == json.dumps(again, sort_keys=True)


@pytest.mark.parametrize("name", SHIPPED)
def test_a_plan_survives_a_json_round_trip(name):
    p = plan(name)
    assert FaultPlan.from_json(p.to_json()) == p
    assert FaultPlan.from_json(json.loads(json.dumps(p.to_json()))) == p


@pytest.mark.parametrize("name", ["kill-storm", "everything", "poison", "duplicate-submit",
                                  "crash-loop", "operator-actions"])
def test_different_seeds_give_different_plans(name):
    a, b = plan(name, 1), plan(name, 2)
    assert (a.timeline, picks(a)) != (b.timeline, picks(b))


def test_different_seeds_give_different_timelines_under_kill_storm():
    assert [e["at"] for e in plan("kill-storm", 1).timeline] != \
           [e["at"] for e in plan("kill-storm", 2).timeline]


@pytest.mark.parametrize("version", [2, 0, None])
def test_a_plan_of_another_version_is_refused_clearly(version):
    data = plan("smoke").to_json()
    data["version"] = version
    with pytest.raises(ValueError) as err:
        FaultPlan.from_json(data)
    message = str(err.value)
    assert f"version {version}" in message and "re-run" in message


# -- the timeline ---------------------------------------------------------------------------

def assert_inside_chaos(p: FaultPlan, chaos: float) -> None:
    ats = [e["at"] for e in p.timeline]
    assert ats == sorted(ats)
    outside = [e for e in p.timeline if not 0 <= e["at"] < chaos]
    assert not outside, f"events outside [0, {chaos}): {outside[:3]}"


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", SHIPPED)
def test_the_timeline_is_sorted_and_inside_the_chaos_phase(name, seed):
    assert_inside_chaos(plan(name, seed), scenario(name).run.chaos)


def test_the_timeline_stays_inside_the_chaos_phase_at_extreme_rates():
    # Thousands of arrivals per second put some within rounding distance of the phase end.
    s = with_changes("kill-storm", run={"jobs": 2, "chaos": 1.0}, faults={"kill": 2000.0})
    for seed in range(20):
        assert_inside_chaos(make_plan(s, seed, PIPELINE), 1.0)


SEEDS = range(8)


@pytest.mark.parametrize("name", ["kill-storm", "everything", "operator-actions"])
def test_each_rate_gives_about_rate_times_duration_events(name):
    s = scenario(name)
    for fault in RATES:
        expected = getattr(s.faults, fault) * s.run.chaos * len(SEEDS)
        observed = sum(1 for seed in SEEDS for e in plan(name, seed).timeline
                       if e["fault"] == fault)
        # the sum over seeds is Poisson(expected): a band of 4.5 standard deviations
        assert abs(observed - expected) <= 4.5 * math.sqrt(expected), (fault, observed, expected)


def test_kill_storm_has_a_poisson_number_of_kills_under_every_seed():
    s = scenario("kill-storm")
    mean = s.faults.kill * s.run.chaos
    for seed in SEEDS:
        kills = sum(1 for e in plan("kill-storm", seed).timeline if e["fault"] == "kill")
        assert abs(kills - mean) <= 5 * math.sqrt(mean), (seed, kills)


def test_outages_and_operator_actions_appear_as_the_scenario_says():
    s, p = scenario("everything"), plan("everything")
    outages = [(e["at"], e["until"]) for e in p.timeline if e["fault"] == "outage"]
    assert outages == list(s.faults.outages)
    actions = {e.get("action") for e in p.timeline if e["fault"] == "operator"}
    assert actions and actions <= {"cancel", "requeue", "resolve"}


def test_each_contention_hold_lasts_as_the_scenario_says():
    fixed = [e["seconds"] for e in plan("everything").timeline if e["fault"] == "contention"]
    assert fixed and set(fixed) == {scenario("everything").faults.contention_seconds}
    f = scenario("db-contention").faults
    drawn = [e["seconds"] for seed in range(1, 6) for e in plan("db-contention", seed).timeline
             if e["fault"] == "contention"]
    assert all(f.contention_seconds <= s <= f.contention_seconds_max for s in drawn)
    # spread over the range, not stuck at one end
    assert min(drawn) < f.contention_seconds + 0.2 and max(drawn) > f.contention_seconds_max - 0.2


@pytest.mark.parametrize("name", ["duplicate-submit", "everything"])
def test_every_duplicate_submission_appears_in_the_timeline(name):
    p = plan(name)
    planned = {(job, kind) for kind, jobs in p.duplicates.items() for job in jobs}
    timeline = [(e["job"], e["kind"]) for e in p.timeline if e["fault"] == "duplicate_submit"]
    assert planned and sorted(timeline) == sorted(planned)


# -- job picks ------------------------------------------------------------------------------

def picks(p: FaultPlan) -> dict[str, list[str]]:
    return {"poison": list(p.poison), "crash_loop": p.crash_loop,
            "needs_review": p.needs_review, "duplicate_same": p.duplicates["same"],
            "duplicate_different": p.duplicates["different"]}


def shares(s) -> dict[str, float]:
    f = s.faults
    return {"poison": f.poison, "crash_loop": f.crash_loop, "needs_review": s.run.needs_review,
            "duplicate_same": f.duplicate_same, "duplicate_different": f.duplicate_different}


def assert_shares_followed(s, p: FaultPlan) -> None:
    assert p.jobs == [job for job, _ in make_documents(s.run.jobs, p.seed)]
    for what, share in shares(s).items():
        chosen = picks(p)[what]
        assert len(set(chosen)) == len(chosen) and set(chosen) <= set(p.jobs), what
        if share == 0:
            assert chosen == [], what
        else:
            assert len(chosen) >= 1, what
            assert abs(len(chosen) - share * s.run.jobs) <= 1, (what, len(chosen))


@pytest.mark.parametrize("profile", ["smoke", "ci"])
@pytest.mark.parametrize("name", SHIPPED)
def test_shares_pick_about_share_times_jobs(name, profile):
    assert_shares_followed(scenario(name, profile), plan(name, 1, profile))


def test_a_small_positive_share_still_picks_one_job():
    s = with_changes("everything", run={"jobs": 4})  # 4 x 0.04..0.1 rounds to 0
    p = make_plan(s, 5, PIPELINE)
    assert_shares_followed(s, p)
    assert all(len(chosen) == 1 for chosen in picks(p).values())


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("name", ["everything", "operator-actions", "smoke"])
def test_poison_crash_loop_and_needs_review_jobs_are_disjoint(name, seed):
    p = plan(name, seed)
    groups = [set(p.poison), set(p.crash_loop), set(p.needs_review)]
    assert sum(map(len, groups)) == len(set().union(*groups))
    assert all(v["step"] in MODEL_STEPS and v["kind"] in POISON_KINDS for v in p.poison.values())


def test_skewed_workers_get_the_skew_in_the_first_slots():
    s, p = scenario("everything"), plan("everything")
    f = s.faults
    assert p.skewed == [f.skew_seconds] * f.skewed_workers + \
        [0.0] * (s.run.workers - f.skewed_workers)


# -- provider and receiver faults -----------------------------------------------------------

@pytest.mark.parametrize("name", ["everything", "provider-outage", "outbox-ambiguous"])
def test_call_faults_are_pure_functions_of_seed_job_step_and_n(name):
    s, p = scenario(name), plan(name)
    twin = FaultPlan.from_json(json.loads(json.dumps(make_plan(load_scenario(name), 1, PIPELINE).to_json())))
    for job, step, n in provider_calls(p, 10):
        assert provider_fault(s, p, job, step, n) == provider_fault(s, twin, job, step, n)
    for job in p.jobs:
        for kind in EFFECT_KINDS:
            for n in range(1, 11):
                assert receiver_fault(s, p, job, kind, n) == receiver_fault(s, twin, job, kind, n)


def test_another_seed_gives_other_call_faults():
    s = scenario("provider-outage")
    a, b = plan("provider-outage", 1), plan("provider-outage", 2)
    calls = provider_calls(a, 5)
    assert [provider_fault(s, a, *c) for c in calls] != [provider_fault(s, b, *c) for c in calls]


def provider_kind(fault: dict) -> str:
    if fault["kind"] == "status":
        return "provider_429" if fault["status"] == 429 else "provider_5xx"
    return fault["kind"]


TOLERANCE = 0.01  # absolute, on shares estimated from >= 16,000 calls (about 4 sigma)


def test_provider_fault_frequencies_match_the_scenario_shares():
    s, p = scenario("everything"), plan("everything")
    calls = [c for c in provider_calls(p, 100)
             if c[0] not in p.poison and c[0] not in p.unavailable]
    faults = [provider_fault(s, p, *c) for c in calls]
    seen = Counter(provider_kind(f) for f in faults if f)
    f = s.faults
    for kind, share in {"provider_429": f.provider_429, "provider_5xx": f.provider_5xx,
                        "hang": f.hang, "reset": f.reset, "slow": f.slow}.items():
        assert abs(seen[kind] / len(calls) - share) <= TOLERANCE, (kind, seen[kind], len(calls))
    assert set(seen) <= {"provider_429", "provider_5xx", "hang", "reset", "slow"}


def test_provider_fault_details_follow_the_scenario():
    s, p = scenario("everything"), plan("everything")
    f = s.faults
    for job, step, n in provider_calls(p, 40):
        fault = provider_fault(s, p, job, step, n)
        if job in p.poison or job in p.unavailable or not fault:
            continue
        if fault.get("status") == 429:  # Retry-After on half of them (odd n)
            assert fault["retry_after"] == (f.retry_after if n % 2 else None)
        elif fault["kind"] == "status":
            assert fault["status"] in (500, 502, 503)
        elif fault["kind"] in ("hang", "slow"):
            assert fault["seconds"] == (f.hang_seconds if fault["kind"] == "hang"
                                        else f.slow_seconds)


def test_faults_come_in_the_forms_real_providers_give_them_at_their_shares():
    s, p = scenario("provider-outage"), plan("provider-outage")
    pol, _ = policy("provider-outage")
    seen: Counter = Counter()
    for c in provider_calls(p, 60):
        for fault in (provider_fault(s, p, *c), pol.provider_fault(*c)):
            if fault is None:
                continue
            form = fault.get("retry_after_form")
            if fault["kind"] == "status" and fault["status"] in (429, 503):
                asked = fault.get("retry_after") is not None
                assert form in ((None, "date") if asked else (None, "junk")), fault
                seen["date" if asked else "junk", form is not None] += 1
            else:
                assert form is None, fault
            if fault["kind"] == "hang":
                seen["trickle", bool(fault.get("trickle"))] += 1
            else:
                assert "trickle" not in fault, fault
    for form, share in (("date", RETRY_AFTER_DATE_SHARE), ("junk", RETRY_AFTER_JUNK_SHARE),
                        ("trickle", TRICKLE_SHARE)):
        total = seen[form, True] + seen[form, False]
        assert total > 100 and abs(seen[form, True] / total - share) < 0.1, (form, seen)


def test_forms_move_no_fault_and_the_outage_refusals_get_them_too():
    s, p = scenario("provider-outage"), plan("provider-outage")
    pol, _ = policy("provider-outage")
    pol.outage.set()
    outage = [pol.provider_fault(*c) for c in provider_calls(p, 10)
              if poison_fault_for(p, c[0], c[1]) is None]
    assert {f.get("retry_after_form") for f in outage} == {None, "junk"}
    for job, step, n in provider_calls(p, 10):
        fault = provider_fault(s, p, job, step, n)
        if fault and fault.get("status") == 429:  # Retry-After on odd n, in either form
            assert formless(fault) == {"kind": "status", "status": 429,
                                       "retry_after": s.faults.retry_after if n % 2 else None}


def test_receiver_fault_frequencies_match_the_scenario_shares():
    s, p = scenario("everything"), plan("everything")
    calls = [(job, kind, n) for job in p.jobs for kind in EFFECT_KINDS for n in range(1, 101)
             if p.declined.get(job) != kind]  # a declined effect is refused every time
    seen = Counter(fault["kind"] for c in calls if (fault := receiver_fault(s, p, *c)))
    f = s.faults
    for kind, share in {"status": f.receiver_5xx, "timeout": f.receiver_timeout,
                        "drop": f.receiver_drop}.items():
        assert abs(seen[kind] / len(calls) - share) <= TOLERANCE, (kind, seen[kind], len(calls))


def test_a_scenario_without_call_faults_never_injects_one():
    s, p = scenario("kill-storm"), plan("kill-storm")
    assert not any(provider_fault(s, p, *c) for c in provider_calls(p, 10))
    assert not any(receiver_fault(s, p, job, kind, n)
                   for job in p.jobs for kind in EFFECT_KINDS for n in range(1, 11))


@pytest.mark.parametrize("name", ["poison", "everything", "operator-actions"])
def test_poison_lands_on_its_step_every_time_and_nowhere_else(name):
    s, p = scenario(name), plan(name)
    assert p.poison
    for job, step, n in provider_calls(p, 30):
        fault, poisoned = provider_fault(s, p, job, step, n), poison_fault_for(p, job, step)
        if poisoned:
            assert formless(fault) == poisoned, (job, step, n)
        else:
            assert not is_poison(fault), (job, step, n, fault)


@pytest.mark.parametrize("name", ["everything", "operator-actions", "smoke"])
def test_documents_for_marks_only_the_needs_review_titles(name):
    p = plan(name)
    originals = dict(make_documents(len(p.jobs), p.seed))
    docs = documents_for(p)
    assert [job for job, _ in docs] == p.jobs
    assert p.needs_review
    for job, payload in docs:
        if job in p.needs_review:
            assert payload == {**originals[job], "title": originals[job]["title"] + " " + MARKER}
        else:
            assert payload == originals[job]
            assert MARKER not in json.dumps(payload)


# -- the fault policy the fakes consult -----------------------------------------------------

POLICY_SCENARIOS = ["everything", "poison", "provider-outage"]
SEND_TIMEOUT = 0.6


def policy(name: str) -> tuple[FaultPolicy, FaultPlan]:
    p = plan(name)
    return FaultPolicy(scenario(name), p, send_timeout=SEND_TIMEOUT), p


@pytest.mark.parametrize("name", POLICY_SCENARIOS)
def test_before_an_outage_the_policy_passes_the_plan_faults_through(name):
    pol, p = policy(name)
    s = scenario(name)
    assert not differences((c, pol.provider_fault(*c), provider_fault(s, p, *c))
                           for c in provider_calls(p))


@pytest.mark.parametrize("name", POLICY_SCENARIOS)
def test_an_outage_makes_every_non_poison_provider_call_a_503(name):
    pol, p = policy(name)
    pol.outage.set()
    want = {"kind": "status", "status": 503, "retry_after": None}
    assert not differences((c, formless(pol.provider_fault(*c)),
                            poison_fault_for(p, c[0], c[1]) or want) for c in provider_calls(p))


@pytest.mark.parametrize("name", POLICY_SCENARIOS)
def test_after_heal_only_poison_and_forced_faults_remain(name):
    pol, p = policy(name)
    s = scenario(name)
    pol.outage.set()
    pol.heal()
    assert not pol.outage.is_set()
    forced_calls = {(job, step) for job, step, *_ in p.forced_provider}
    for job, step, n in provider_calls(p):
        got = pol.provider_fault(job, step, n)
        if n == 1 and (job, step) in forced_calls:
            assert got is not None and got == provider_fault(s, p, job, step, n)
        else:
            assert formless(got) == poison_fault_for(p, job, step), (job, step, n)
    forced_effects = {(job, kind) for job, kind, _ in p.forced_receiver}
    for job in p.jobs:
        for kind in EFFECT_KINDS:
            for n in range(1, 21):
                got = pol.receiver_fault(job, kind, n)
                if p.declined.get(job) == kind:  # refused for good: it never heals
                    assert got == {"kind": "status", "status": 402}
                else:
                    assert (got is not None) == (n == 1 and (job, kind) in forced_effects)


def test_every_configured_share_fault_is_forced_onto_one_early_call():
    s = scenario("everything")
    p = make_plan(s, 1, PIPELINE)
    assert sorted(tuple(entry[2:]) for entry in p.forced_provider) == [
        ("hang",), ("hang", "trickle"), ("provider_429",), ("provider_5xx",), ("reset",),
        ("slow",)]
    assert {name for _, _, name in p.forced_receiver} == {
        "receiver_5xx", "receiver_timeout", "receiver_drop", "receiver_lost"}
    clean = [j for j in p.jobs if j not in p.poison and j not in p.crash_loop
             and j not in p.needs_review]
    assert {job for job, *_ in p.forced_provider} <= set(clean[:6])
    # The hang is forced in both its forms: silence, and an answer trickled byte by byte.
    hangs = [provider_fault(s, p, job, step, 1) for job, step, name, *_ in p.forced_provider
             if name == "hang"]
    assert len(hangs) == 2 and any(h.get("trickle") for h in hangs)


def test_receiver_timeouts_outlast_the_send_timeout():
    pol, p = policy("everything")
    s = scenario("everything")
    timeouts = 0
    for job in p.jobs:
        for kind in EFFECT_KINDS:
            for n in range(1, 21):
                planned, got = receiver_fault(s, p, job, kind, n), pol.receiver_fault(job, kind, n)
                if planned and planned["kind"] in ("timeout", "lost"):
                    timeouts += 1
                    assert got == {**planned, "seconds": pytest.approx(SEND_TIMEOUT + 0.3)}
                else:
                    assert got == planned
    assert timeouts > 0


def test_declined_documents_are_refused_for_good_on_every_request_and_leave_plans_alone():
    p = plan("outbox-ambiguous")
    assert p.declined and set(p.declined.values()) == {PIPELINE.effects[0]}
    assert not set(p.declined) & (set(p.poison) | set(p.crash_loop) | set(p.unavailable))
    job, kind = next(iter(p.declined.items()))
    pol, _ = policy("outbox-ambiguous")
    for n in range(1, 8):
        assert pol.receiver_fault(job, kind, n) == {"kind": "status", "status": 402}
    pol.heal()
    assert pol.receiver_fault(job, kind, 9) == {"kind": "status", "status": 402}  # never heals
    # Drawn after everything else: without declined documents, the plan is the one it was.
    quiet = with_changes("outbox-ambiguous", faults={"declined": 0.0})
    same = make_plan(quiet, 1, PIPELINE)
    assert not same.declined
    assert {**same.to_json(), "declined": p.declined} == p.to_json()


def test_unavailable_documents_are_their_own_and_get_a_503_on_every_call():
    p = plan("provider-outage")
    assert p.unavailable, "provider-outage plans documents the model is unavailable for"
    assert not set(p.unavailable) & (set(p.poison) | set(p.crash_loop) | set(p.needs_review))
    job, step = next(iter(p.unavailable.items()))
    pol, _ = policy("provider-outage")
    for n in range(1, 12):
        assert formless(pol.provider_fault(job, step, n)) == {"kind": "status", "status": 503,
                                                              "retry_after": None}
    pol.heal()
    assert pol.provider_fault(job, step, 20)["status"] == 503  # it never heals
