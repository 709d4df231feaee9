"""The checkers read nothing the history's schema does not state (chaos.engines.schema), and each
declares what it reads (its module's READS): every field each checker asks of the engine's
operations is recorded over real simulated histories of three engines of different shapes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict

from chaos import history as hist
from chaos.engines import schema
from chaos.checkers import CHECKERS, INVARIANTS, READS, Snapshot, load
from chaos.checkers import index as checker_index

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "runs", "pass")
load()


#: Fields the checkers ask of operations of a type that does not carry them, reading the
#: one true answer of their absence (`.get` gives None); each reviewed, with why.
NOT_CARRIED = {
    ("billed", "kind"): "a billed call is no outbox write",
    ("memo", "kind"): "a memo is no outbox write",
    ("billed", "lease_until"): "a billed call's record extends no lease",
    ("memo", "lease_until"): "a memo extends no lease",
    ("memo", "heartbeat"): "a memo is no renewal",
    ("claimed", "heartbeat"): "a claim is no renewal",
    ("billed", "t_start"): "the provider's ledger has t_start; a spend record has started",
    ("claimed", "took_lease"): "a claim takes its lease by its type",
    ("submitted", "took_lease"): "a submission takes no lease",
    ("effect_queued", "took_lease"): "took_lease is a job write's",
    ("effect_claimed", "took_lease"): "took_lease is a job write's",
    ("effect_sent", "took_lease"): "took_lease is a job write's",
    ("effect_state", "took_lease"): "took_lease is a job write's",
}


class Recorded(dict):
    """An operation that notes every field a checker asks of it."""

    reads: dict = defaultdict(set)
    invariant = ""

    def _note(self, key, how):
        if dict.get(self, "src") == "engine":
            Recorded.reads[(Recorded.invariant, dict.get(self, "type"), key)].add(how)

    def __getitem__(self, key):
        self._note(key, "[]")
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        self._note(key, "get")
        return dict.get(self, key, default)

    def __contains__(self, key):
        self._note(key, "in")
        return dict.__contains__(self, key)


def simulated(tmp_path, scenario, engine):
    out = tmp_path / engine.replace(":", "_")
    subprocess.run([sys.executable, "-m", "chaos.commands.cli", "sim", scenario, "--seeds", "1",
                    "--engine", engine, "--out", str(out)], check=False,
                   capture_output=True, timeout=240, cwd=ROOT)
    folders = sorted(p for p in out.glob("*/sim-*") if (p / "history.jsonl").exists())
    assert folders, f"the sim of {scenario} on {engine} wrote no history"
    return folders[0]


def test_every_field_a_checker_reads_is_declared_and_in_the_schema(tmp_path):
    runs = [FIXTURE, os.path.join(ROOT, "tests", "fixtures", "runs", "fail"),
            simulated(tmp_path, "everything", "reference"),
            simulated(tmp_path, "everything", "examples.toy_engine.adapter:TOY"),
            simulated(tmp_path, "everything", "examples.article_engine.adapter:ARTICLE")]
    Recorded.reads.clear()
    for run in runs:
        events = [Recorded(e) for e in hist.read_history(os.path.join(run, "history.jsonl"))]
        with open(os.path.join(run, "snapshot.json"), encoding="utf-8") as fh:
            snap = json.load(fh)
        for name in INVARIANTS:
            Recorded.invariant = name
            checker_index._last = None  # each check builds the shared readings it reads
            CHECKERS[name](events, Snapshot(snap))  # the checker alone, not the gate before it
    common = {"t", "src", "type", "completion", "seq", "attributed"}
    undeclared, unstated = [], []
    for (name, kind, key), hows in sorted(Recorded.reads.items()):
        spec = schema.SCHEMA[kind]
        if key in common:
            continue
        if spec.field(key) is None:
            if (kind, key) not in NOT_CARRIED or hows != {"get"}:
                unstated.append(f"{name} reads {kind}.{key} ({'/'.join(sorted(hows))})")
        elif f"{kind}.{key}" not in READS.get(name, ()):
            undeclared.append(f"{name} reads {kind}.{key}")
    assert not unstated, "fields read that the schema does not state: " + "; ".join(unstated)
    assert not undeclared, "fields read that the checker does not declare: " + \
        "; ".join(undeclared)
