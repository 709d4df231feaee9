"""The operator's job list (`ninelives engine jobs`): the store lists the jobs in some states by
id, oldest write first, with how many there are in all, on every backend; `--state` takes
groups and state names and refuses anything else naming itself; and every id is shown as a
shell word that a real shell reads back into exactly that id."""
from __future__ import annotations

import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import ConfigError
from engine.joblist import listing, shell_word, states_named

from store_backends import BACKENDS

STORE_BACKENDS = BACKENDS
NOW = 1_000_000.0
#: id, state, attempts, updated, last_error
JOBS = [
    ("old-parked", "failed_fetch", 5, NOW - 900, "fetch: 503 (parked after 5 attempts)"),
    ("review", "needs_human", 0, NOW - 600, "verify: flagged for review"),
    ("b-parked", "failed_extract", 1, NOW - 300, "extract: schema"),
    ("a-parked", "failed_extract", 1, NOW - 300, "extract: schema"),
    ("waiting", "pending", 0, NOW - 100, None),
    ("busy", "fetching", 0, NOW - 50, None),
    ("done", "delivered", 0, NOW - 10, None),
]


@pytest.fixture
def listed(store):
    with store.write() as conn:
        for job_id, state, attempts, updated, error in JOBS:
            conn.execute("INSERT INTO job (id, pipeline, state, payload, attempts, last_error,"
                         " created, updated) VALUES (?, 'document', ?, '{}', ?, ?, ?, ?)",
                         (job_id, state, attempts, error, updated - 1, updated))
    return store


def test_the_store_lists_jobs_in_the_states_asked_oldest_write_first(listed, pipeline):
    rows, total = listed.jobs(pipeline.parked_states, NOW)
    assert total == 4
    assert [(r["id"], r["state"], r["attempts"], r["age_s"]) for r in rows] == [
        ("old-parked", "failed_fetch", 5, 900.0), ("review", "needs_human", 0, 600.0),
        ("a-parked", "failed_extract", 1, 300.0), ("b-parked", "failed_extract", 1, 300.0)]
    assert rows[0]["error"] == "fetch: 503 (parked after 5 attempts)"
    assert rows[0]["pipeline"] == "document"


def test_a_limit_lists_the_oldest_and_still_counts_them_all(listed, pipeline):
    rows, total = listed.jobs(pipeline.parked_states, NOW, limit=1)
    assert ([r["id"] for r in rows], total) == (["old-parked"], 4)
    assert listed.jobs(frozenset({"cancelled"}), NOW) == ([], 0)


def test_the_listing_names_each_jobs_step_and_counts_the_rest(listed, pipeline):
    answer = listing(listed, pipeline, states_named(pipeline, "parked,pending"), NOW, 3)
    assert [(j["id"], j["state"], j["step"]) for j in answer["jobs"]] == [
        ("old-parked", "failed_fetch", "fetch"), ("review", "needs_human", "verify"),
        ("a-parked", "failed_extract", "extract")]
    assert (answer["total"], answer["more"]) == (5, 2)
    working = listing(listed, pipeline, pipeline.working_states, NOW, 50)
    assert [(j["id"], j["step"]) for j in working["jobs"]] == [("busy", "fetch")]
    assert [j["step"] for j in listing(listed, pipeline, {"delivered"}, NOW, 5)["jobs"]] == ["-"]


@pytest.mark.parametrize("text,states", [
    ("parked", {"failed_fetch", "failed_extract", "failed_deliver", "needs_human"}),
    ("ready", {"pending", "fetched", "extracted", "verified"}),
    ("needs_human, pending", {"needs_human", "pending"}),
])
def test_state_takes_groups_and_state_names(pipeline, text, states):
    assert states_named(pipeline, text) == states


def test_an_unknown_state_is_refused_naming_the_flag_and_what_it_takes(pipeline):
    with pytest.raises(ConfigError, match=r"--state: 'parkd' is no state of pipeline "
                                          r"'document' \(it takes parked, .*needs_human"):
        states_named(pipeline, "parked,parkd")


def shell_reads(words: list[str]) -> list[str]:
    """What a real bash makes of `words` pasted on a command line."""
    script = "printf '%s\\0' " + " ".join(words)
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True,
                         env={"LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin"}).stdout
    return out.decode("utf-8").split("\0")[:-1]


ODD_IDS = ["doc-7", "with space", "-starts-with-dash", "it's", "tab\there", "new\nline",
           "ünïcode", "$(touch pwned)", "`x`", "esc\x1b[31mred", "back\\slash", "", "a\u200db",
           "nbsp\xa0", "*", "~user", "!bang"]


def test_each_odd_id_shown_reads_back_as_itself_in_one_line():
    shown = [shell_word(job_id) for job_id in ODD_IDS]
    assert shell_reads(shown) == ODD_IDS
    assert all(w.isprintable() for w in shown), shown  # no newline, no escape sequence
    assert shown[:3] == ["doc-7", "'with space'", "-starts-with-dash"]  # plain ids stay plain


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",),
                                      blacklist_characters="\0")), min_size=1, max_size=6))
def test_any_id_shown_reads_back_as_itself(ids):
    assert shell_reads([shell_word(i) for i in ids]) == ids
