"""`ninelives engine jobs` as real processes on every backend: it lists parked jobs by id, and
each id pasted as printed into `requeue` (through a real shell) acts on that very job; the
JSON carries the ids whole and says how many a limit left out."""
from __future__ import annotations

import json
import shlex
import subprocess
import time

from engine import DOCUMENT, open_store

from store_backends import BACKENDS

STORE_BACKENDS = BACKENDS
#: ids a caller may well choose, and that a shell would mangle if printed bare
ODD_IDS = ["doc-1", "with space", "-dash", "it's", "new\nline", "$(touch pwned)"]


def park(db: str, ids: list[str]) -> None:
    """Submit each job and park it in failed_fetch through the engine's own store."""
    store = open_store(db, synchronous="NORMAL")
    try:
        for i, job_id in enumerate(ids):
            now = time.time() - 100 + i  # the first id is the oldest
            store.submit(job_id, DOCUMENT, {"title": "t", "body": "b"}, now)
            claim = store.claim(DOCUMENT, "test", now, 5.0, 10)
            store.fail(claim, DOCUMENT, "test", now, error="fetch: provider down",
                       retry_at=None)
    finally:
        store.close()


def id_column(table: str) -> list[str]:
    """The id cells of `jobs`' table, as a user copies them."""
    lines = table.splitlines()
    cut = lines[0].index("state")
    return [line[:cut].rstrip() for line in lines[1:] if line[:1] != " " and "  " in line]


def test_each_parked_id_printed_can_be_requeued_as_printed(engine, db_target, tmp_path):
    park(db_target, ODD_IDS)
    out = engine.ok("jobs", "--state", "parked").stdout
    shown = id_column(out.split("\nact on one:")[0])
    assert len(shown) == len(ODD_IDS), out
    assert "-- ID" in out  # how to pass an id that starts with -
    # the user pastes each id after `--`, as the footer says, into a real shell
    base = " ".join(shlex.quote(a) for a in engine.argv("requeue"))
    script = "\n".join(f"{base} -- {word} || exit 9" for word in shown)
    ran = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                         cwd=tmp_path, env=engine.env, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.count("requeued to pending") == len(ODD_IDS), ran.stdout
    assert not (tmp_path / "pwned").exists()
    store = open_store(db_target, read_only=True)
    try:
        states = {r["id"]: r["state"] for r in store.query("SELECT id, state FROM job")}
    finally:
        store.close()
    assert states == {job_id: "pending" for job_id in ODD_IDS}


def test_the_json_carries_whole_ids_and_counts_what_the_limit_left_out(engine, db_target,
                                                                        backend):
    park(db_target, ODD_IDS)
    answer = json.loads(engine.ok("jobs", "--json", "--limit", "2").stdout)
    assert [(j["id"], j["state"], j["step"], j["attempts"]) for j in answer["jobs"]] == [
        ("doc-1", "failed_fetch", "fetch", 1), ("with space", "failed_fetch", "fetch", 1)]
    assert answer["jobs"][0]["error"] == "fetch: provider down"
    # SQLite dates a write by the caller's clock (100 s back here), PostgreSQL by its own
    oldest = 100 if backend == "sqlite" else 0
    assert oldest - 1 <= answer["jobs"][0]["age_s"] < oldest + 60
    assert (answer["total"], answer["more"]) == (len(ODD_IDS), len(ODD_IDS) - 2)
    text = engine.ok("jobs", "--limit", "2").stdout
    assert f"{len(ODD_IDS) - 2} more not shown: {len(ODD_IDS)} in all" in text
    ran = engine.run("jobs", "--state", "parkd")
    assert ran.returncode == 2 and ran.stderr.startswith("error: --state: 'parkd'"), str(ran)
    assert "Traceback" not in ran.stderr
