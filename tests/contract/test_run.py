"""The contract's promises about a real run: a worker and a sender started with the adapter's
own commands take a job to the pipeline's terminal state, and the observer tells it truly.
One run per adapter (the session fixture `run`), read by every test here."""
from __future__ import annotations

from chaos.contract import has
from chaos.history import EFFECT_OPS, JOB_OPS

ENGINE_TYPES = JOB_OPS | EFFECT_OPS | {"memo", "billed"}
SNAPSHOT_JOB = {"state", "attempts", "claims", "last_error", "payload_hash", "cause"}
SNAPSHOT_MEMO = {"job", "step", "cost"}
SNAPSHOT_OUTBOX = {"row", "job", "kind", "key", "sent_at", "dead_at", "attempts", "last_error"}


def _of(run, type_):
    return [op for op in run.operations if op["type"] == type_ and op.get("job") == run.job]


def test_a_real_worker_and_sender_take_the_job_to_the_terminal_state(run):
    assert run.error is None, f"{run.error}\n{run.logs}"
    state = run.snapshot["jobs"][run.job]["state"]
    assert run.reached and state == run.terminal, (
        f"job is {state}, progress {run.progress}\n{run.logs}")


def test_claims_name_the_real_worker_process(run):
    claims = _of(run, "claimed")
    assert claims, f"no claimed operation\n{run.logs}"
    for op in claims:
        assert op["worker"], op
        if not hasattr(run.engine, "pid_of"):
            # its ids name no process (DBOS's executor id outlives one): none is guessed
            assert op["pid"] is None, op
            continue
        assert op["pid"] in run.pids["worker"], (op, run.pids)


def test_every_model_step_leaves_one_memo(run):
    memos = _of(run, "memo")
    for step in run.engine.pipeline.model_steps:
        mine = [op for op in memos if op["step"] == step and op.get("op", "insert") == "insert"]
        assert len(mine) == 1, f"step {step}: {mine}"
        # pid is the writer's when the engine records who wrote (None otherwise)
        assert mine[0]["pid"] in run.pids["worker"] | {None}, mine[0]


def test_every_effect_kind_is_queued_and_sent(run):
    if not has(run.engine, "outbox"):
        return
    for kind in run.engine.pipeline.effects:
        queued = [op for op in _of(run, "effect_queued") if op["kind"] == kind]
        sent = [op for op in _of(run, "effect_sent") if op["kind"] == kind]
        assert len(queued) == 1 and queued[0]["key"], f"{kind}: {queued}"
        assert len(sent) == 1 and sent[0]["pid"] in run.pids["sender"] | {None}, f"{kind}: {sent}"
        assert sent[0]["row"] == queued[0]["row"]
    applied = [r for r in run.requests if r.get("applied")]
    assert sorted(r["kind"] for r in applied) == sorted(run.engine.pipeline.effects)


def test_every_operation_is_an_engine_operation_of_the_vocabulary(run):
    assert run.operations
    for op in run.operations:
        assert isinstance(op["t"], float) and op["src"] == "engine", op
        assert op["type"] in ENGINE_TYPES, op
        assert op.get("completion", "ok") == "ok", op
    times = [op["t"] for op in run.operations]
    assert times == sorted(times), "operations are not in commit order"
    assert all(op["actor"] == "worker" for op in _of(run, "state")
               if op["to"] != op["from"] and op["to"] != run.engine.pipeline.initial)


def test_progress_counts_states(run):
    assert sum(run.progress["states"].values()) == len(run.snapshot["jobs"]) == 1
    assert set(run.progress["states"]) <= run.engine.pipeline.states
    assert run.progress["unsent"] == 0


def test_snapshot_is_in_the_neutral_form(run):
    snap = run.snapshot
    assert {"jobs", "memos", "outbox", "spend", "orphans"} <= set(snap)
    for row in snap["jobs"].values():
        assert SNAPSHOT_JOB <= set(row), row
    for memo in snap["memos"]:
        assert SNAPSHOT_MEMO <= set(memo), memo
    assert {m["step"] for m in snap["memos"]} >= set(run.engine.pipeline.model_steps)
    for row in snap["outbox"]:
        assert SNAPSHOT_OUTBOX <= set(row), row
        assert row["sent_at"] is not None, row
    if has(run.engine, "spend_records"):
        assert isinstance(snap["spend"], list) and snap["spend"]
    else:
        assert snap["spend"] is None or isinstance(snap["spend"], list)
    assert isinstance(snap["orphans"], dict) and not any(snap["orphans"].values())
    if has(run.engine, "integrity"):
        assert run.engine.integrity(run.db) == "ok"


def test_the_fake_provider_attributes_every_call_to_the_job(run):
    calls = [c for c in run.calls if c.get("job") == run.job]
    assert calls and len(calls) == len(run.calls), run.calls
    assert {c["step"] for c in calls} == set(run.engine.pipeline.model_steps)
