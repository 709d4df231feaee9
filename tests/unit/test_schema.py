"""The history's vocabulary as data (chaos.engines.schema): operations are checked and filled in as
they are read, an evidence field left out makes exactly the checks that read it unknown, the
checkers read nothing the schema does not state, and docs/history.md is the schema's page."""
from __future__ import annotations

import copy
import json
import os

import pytest

from chaos import history as hist
from chaos.docs import history_page
from chaos.engines import schema
from chaos.checkers import INVARIANTS, READS, load, run_checkers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "runs", "pass")
load()


def claimed(**over):
    op = {"t": 10.0, "src": "engine", "type": "claimed", "job": "doc-1", "step": "fetch",
          "from": "pending", "to": "fetching", "worker": "w1", "pid": 7, "token": 1,
          "lease_until": 12.0, "attempts": 0, "claims": 1}
    op.update(over)
    return {k: v for k, v in op.items() if v is not ...}


# -- read_operations: required fields, types, defaults -------------------------------------

def test_an_operation_without_a_required_field_names_type_field_example_and_method():
    with pytest.raises(schema.OperationError) as caught:
        schema.read_operations([claimed(), claimed(step=...)])
    text = str(caught.value)
    assert "operations(db)" in text
    assert "a 'claimed' operation lacks 'step'" in text
    assert "operation 2 of 2" in text and '"job": "doc-1"' in text
    assert "docs/history.md" in text


@pytest.mark.parametrize("field, value, words", [
    ("lease_until", "soon", "is str \"soon\", not seconds since the epoch"),
    ("attempts", True, "is bool true, not a whole number"),
    ("t", float("nan"), "not seconds since the epoch"),
    ("actor", "robot", "is 'robot', not one of 'worker'"),
    ("from", None, "is None, which this field may not be"),
])
def test_a_mistyped_field_is_named_with_what_it_should_be(field, value, words):
    with pytest.raises(schema.OperationError) as caught:
        schema.read_operations([claimed(**{field: value})])
    assert f"a 'claimed' operation's {field!r} " in str(caught.value)
    assert words in str(caught.value)


def test_an_unknown_type_or_a_non_list_is_refused():
    with pytest.raises(schema.OperationError, match="'claim' is none of the engine's"):
        schema.read_operations([claimed(type="claim")])
    with pytest.raises(schema.OperationError, match="returned dict, not a list"):
        schema.read_operations({"ops": []})


def test_defaulted_fields_are_filled_with_their_one_true_reading():
    submitted = {"t": 1.0, "src": "engine", "type": "submitted", "job": "doc-1",
                 "state": "pending"}
    sent = {"t": 5.5, "src": "engine", "type": "effect_sent", "row": 3, "job": "doc-1",
            "kind": "charge"}
    ops = schema.read_operations([submitted, claimed(actor=..., continued=...), sent])
    assert (ops[0]["from"], ops[0]["to"], ops[0]["actor"]) == (None, "pending", "submitter")
    assert (ops[1]["actor"], ops[1]["continued"]) == ("worker", False)
    assert (ops[2]["sent_at"], ops[2]["actor"], ops[2]["completion"]) == (5.5, "sender", "ok")


def test_evidence_fields_stay_absent_and_are_reported_as_missing():
    ops = schema.read_operations([claimed(lease_until=...), claimed()])
    assert "lease_until" not in ops[0]
    assert schema.missing_evidence(ops, ["claimed.lease_until", "claimed.worker"]) == [
        "claimed.lease_until (1 of 2 operations)"]


def test_reads_refuses_a_field_the_schema_does_not_state():
    assert schema.reads(claimed="job step") == ("claimed.job", "claimed.step")
    with pytest.raises(ValueError, match="no field 'sent_at'"):
        schema.reads(claimed="sent_at")
    with pytest.raises(ValueError, match="'claim' is not an engine operation type"):
        schema.reads(claim="job")


# -- the snapshot ------------------------------------------------------------------------

def test_the_fixture_snapshot_reads_and_a_broken_one_is_named():
    with open(os.path.join(FIXTURE, "snapshot.json"), encoding="utf-8") as fh:
        snap = json.load(fh)
    schema.read_snapshot(snap)
    broken = copy.deepcopy(snap)
    del broken["outbox"][0]["key"]
    with pytest.raises(schema.OperationError, match=r"outbox\[0\] lacks 'key'"):
        schema.read_snapshot(broken)
    broken = copy.deepcopy(snap)
    next(iter(broken["jobs"].values()))["state"] = 3
    with pytest.raises(schema.OperationError, match=r"jobs\['.*'\]'s 'state' is int 3"):
        schema.read_snapshot(broken)
    with pytest.raises(schema.OperationError, match="lacks the table 'orphans'"):
        schema.read_snapshot({k: v for k, v in snap.items() if k != "orphans"})


def test_a_snapshot_field_that_may_be_none_is_read_as_none_when_left_out():
    with open(os.path.join(FIXTURE, "snapshot.json"), encoding="utf-8") as fh:
        snap = json.load(fh)
    job = next(iter(snap["jobs"].values()))
    for name in ("attempts", "claims", "payload_hash", "cause"):
        del job[name]  # an engine that keeps none of them need not write four Nones
    read = schema.read_snapshot(snap)
    assert [next(iter(read["jobs"].values()))[n] for n in ("attempts", "claims",
                                                         "payload_hash", "cause")] == [None] * 4


# -- evidence left out: exactly the checks that read it -----------------------------------

def fixture():
    events = hist.read_history(os.path.join(FIXTURE, "history.jsonl"))
    with open(os.path.join(FIXTURE, "snapshot.json"), encoding="utf-8") as fh:
        return events, json.load(fh)


def test_a_missing_evidence_field_makes_exactly_its_readers_unknown_naming_it():
    events, snap = fixture()
    before = {v.name: v.status for v in run_checkers(events, snap)}
    stripped = [{k: v for k, v in e.items() if not (e.get("type") == "claimed"
                                                     and k == "lease_until")}
                for e in events]
    after = {v.name: v for v in run_checkers(stripped, snap)}
    readers = {name for name, items in READS.items() if "claimed.lease_until" in items}
    assert readers >= {"lease-kept", "fenced-writes", "lease-exclusive"}
    for name in INVARIANTS:
        if name in readers:
            assert after[name].status == "unknown", name
            assert "claimed.lease_until (" in after[name].reason
        else:
            assert after[name].status == before[name], name


# -- the reference page -------------------------------------------------------------------

def test_the_reference_page_is_the_schemas():
    path = os.path.join(ROOT, "docs", "history.md")
    with open(path, encoding="utf-8") as fh:
        page = fh.read()
    assert page == history_page.reference_page(), (
        "docs/history.md is stale: run `python -m chaos.docs.history_page --write docs/history.md`")


def test_the_page_names_what_leaving_each_field_out_costs():
    page = history_page.reference_page()
    assert "| `step` | `str`, may be None |" in page  # a claim's step: required, nullable
    assert "absent, the run stops (exit 2)" in page
    lease_row = next(line for line in page.splitlines()
                     if line.startswith("| `lease_until`") and "evidence" in line)
    assert "`lease-kept`" in lease_row and "judge(s) `unknown`" in lease_row
    assert "absent: read as the operation's time `t`" in page  # effect_sent's sent_at
