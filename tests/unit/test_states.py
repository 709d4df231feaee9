"""The state table and pipeline definitions: DOCUMENT is the article's table plus the documented
operator edges, illegal transitions fail loudly, and bad pipeline definitions fail at
construction naming the offending step or state."""
from __future__ import annotations

import pytest

from engine import states
from engine.states import (DOCUMENT, STATES, IllegalTransition, PipelineError, Step,
                           build_pipeline, get_pipeline, register_pipeline)

#: The article's STATES constant, copied verbatim from the design article
#: ("The state machine, written out"), so the suite does not depend on that file.
ARTICLE_STATES = {
    "pending":    ["fetching", "cancelled"],
    "fetching":   ["fetched", "failed_fetch", "pending"],
    "fetched":    ["extracting"],
    "extracting": ["extracted", "failed_extract", "fetched"],
    "extracted":  ["verifying"],
    "verifying":  ["verified", "needs_human", "extracted"],
    "verified":   ["delivering"],
    "delivering": ["delivered", "failed_deliver", "verified"],
    "delivered":  [],
    "needs_human": ["extracted", "cancelled"],
    "cancelled":  [],
    "failed_fetch":   ["pending"],
    "failed_extract": ["fetched"],
    "failed_deliver": ["verified"],
}
ARTICLE_EDGES = {(frm, to) for frm, tos in ARTICLE_STATES.items() for to in tos}
READY = {"pending", "fetched", "extracted", "verified"}
WORKING = {"fetching", "extracting", "verifying", "delivering"}
PARKED = {"failed_fetch", "failed_extract", "needs_human", "failed_deliver"}
#: DESIGN.md: "every ready and parked state -> cancelled" (the article has two of them).
CANCEL_EDGES = {(state, "cancelled") for state in READY | PARKED}


def table_edges(table) -> set[tuple[str, str]]:
    return {(frm, to) for frm, tos in table.items() for to in tos}


def test_document_states_are_the_articles():
    assert set(STATES) == set(ARTICLE_STATES)
    assert DOCUMENT.ready_states == READY
    assert DOCUMENT.working_states == WORKING
    assert DOCUMENT.parked_states == PARKED
    assert DOCUMENT.terminal == {"delivered", "cancelled"}


def test_document_table_is_the_articles_plus_the_operator_cancel_edges():
    assert table_edges(STATES) == ARTICLE_EDGES | CANCEL_EDGES


@pytest.mark.parametrize("frm,to", sorted(ARTICLE_EDGES | CANCEL_EDGES))
def test_every_documented_edge_is_accepted(frm, to):
    DOCUMENT.check(frm, to, operator=True)


def test_worker_edges_are_only_claims_outcomes_and_retries():
    worker = table_edges(DOCUMENT.edges)
    for step in DOCUMENT.steps:
        assert (step.ready, step.working) in worker
        assert {(step.working, step.done), (step.working, step.parked),
                (step.working, step.ready)} <= worker  # the retry edge is in the table
    # Requeue and cancel are for operators only.
    assert not worker & CANCEL_EDGES
    assert ("failed_fetch", "pending") not in worker


@pytest.mark.parametrize("terminal", sorted(DOCUMENT.terminal))
def test_terminal_states_have_no_edge_out(terminal):
    assert STATES[terminal] == ()
    assert not DOCUMENT.edges[terminal]
    assert not DOCUMENT.operator_edges.get(terminal)
    for to in STATES:
        assert not DOCUMENT.is_edge(terminal, to, operator=True)


@pytest.mark.parametrize("frm,to,operator", [
    ("pending", "delivered", True),       # a shortcut past every step
    ("fetching", "extracting", False),    # skips fetched
    ("delivered", "pending", True),       # leaves a terminal state
    ("cancelled", "pending", True),
    ("fetching", "cancelled", True),      # a leased job cannot be cancelled
    ("failed_fetch", "pending", False),   # requeue is an operator edge
    ("needs_human", "cancelled", False),
])
def test_illegal_transition_raises_naming_both_states(frm, to, operator):
    with pytest.raises(IllegalTransition) as err:
        DOCUMENT.check(frm, to, operator=operator)
    assert frm in str(err.value) and to in str(err.value)
    assert not DOCUMENT.is_edge(frm, to, operator=operator)


def test_unknown_state_is_an_illegal_transition():
    with pytest.raises(IllegalTransition, match="sleeping"):
        DOCUMENT.check("sleeping", "pending")


# -- custom pipelines ------------------------------------------------------------------------

DRAFT = Step("draft", ready="todo", working="drafting", done="drafted", parked="draft_failed")
PUBLISH = Step("publish", ready="drafted", working="publishing", done="published",
               parked="publish_failed")


@pytest.mark.parametrize("steps,problem", [
    ([], "has no steps"),
    ([DRAFT, Step("draft", "drafted", "publishing", "published", "publish_failed")],
     "step name 'draft' is used twice"),
    ([DRAFT, Step("publish", "reviewed", "publishing", "published", "publish_failed")],
     "ends in 'drafted' but the next step 'publish' starts from 'reviewed'"),
    ([DRAFT, Step("publish", "drafted", "drafting", "published", "publish_failed")],
     "working state 'drafting' is used twice"),
    ([Step("draft", "todo", "todo", "drafted", "draft_failed")], "four distinct states"),
    ([Step("draft", "todo", "drafting", "drafted", "drafted")], "four distinct states"),
    ([Step("draft", "todo", "drafting", "drafted", "")], "empty 'parked'"),
])
def test_build_pipeline_rejects_bad_definitions_naming_the_problem(steps, problem):
    with pytest.raises(PipelineError) as err:
        build_pipeline("blog", steps)
    assert problem in str(err.value)
    assert "'blog'" in str(err.value)


def test_a_valid_two_step_pipeline_builds_its_table():
    blog = build_pipeline("blog", [DRAFT, PUBLISH])
    assert blog.initial == "todo"
    assert blog.terminal == {"published", "cancelled"}
    assert table_edges(blog.edges) == {
        ("todo", "drafting"), ("drafting", "drafted"), ("drafting", "draft_failed"),
        ("drafting", "todo"), ("drafted", "publishing"), ("publishing", "published"),
        ("publishing", "publish_failed"), ("publishing", "drafted")}
    assert table_edges(blog.operator_edges) == {
        ("draft_failed", "todo"), ("draft_failed", "cancelled"), ("todo", "cancelled"),
        ("publish_failed", "drafted"), ("publish_failed", "cancelled"), ("drafted", "cancelled")}
    assert blog.step_for("publishing") is PUBLISH


@pytest.fixture
def registered():
    """Register pipelines for one test only; the registry is process-wide."""
    names = []

    def register(pipeline):
        names.append(pipeline.name)
        register_pipeline(pipeline)

    yield register
    for name in names:
        states.PIPELINES.pop(name, None)


def test_registered_pipeline_is_found_by_name(registered):
    blog = build_pipeline("blog-test", [DRAFT, PUBLISH])
    registered(blog)
    assert get_pipeline("blog-test") is blog
    assert get_pipeline("document") is DOCUMENT


def test_unknown_pipeline_name_is_named_in_the_error():
    with pytest.raises(PipelineError, match="'no-such-pipeline'"):
        get_pipeline("no-such-pipeline")
