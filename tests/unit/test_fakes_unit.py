"""The fakes' pure parts, without a server: the answer to any step and to any prompt, the pieces
a stream is cut into, the attribution order, and the completion each outcome maps to."""

import hashlib
import json
import math
import os
import time

import pytest

from chaos.fakes.attribution import call_attribution, effect_attribution
from chaos.fakes.answers import any_step_output, free_form, reply, step_output, tokens
from chaos.fakes.provider import _completion as call_completion
from chaos.fakes.stream import pieces
from chaos.fakes.receiver import _completion as effect_completion
from chaos.fakes.server import BadRequest


def digest(value) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


# --- any step --------------------------------------------------------------------------------------

def test_document_steps_keep_their_own_outputs():
    assert step_output("verify", {"title": "t"}) == {"ok": True, "reason": "ok"}
    with pytest.raises(BadRequest):
        step_output("fetch", ["not", "an", "object"])


def test_any_other_step_is_answered_from_the_canonical_input():
    step_input = {"é": "Ünïcode  text", "list": [1, "two words", None, {"k": "v"}]}
    assert step_output("translate", step_input) == {
        "step": "translate", "digest": digest(step_input), "summary": "two words v Ünïcode text",
        "words": 5}
    assert step_output("translate", json.loads(json.dumps(step_input))) == step_output("translate", step_input)


@pytest.mark.parametrize("step_input", [[], "", 7, None, {"n": 1.5}])
def test_inputs_without_words_still_get_a_digest(step_input):
    answer = any_step_output("score", step_input)
    assert (answer["summary"], answer["words"], answer["digest"]) == ("", 0, digest(step_input))


def test_the_same_input_under_two_steps_differs_only_in_the_step():
    first, second = any_step_output("a", {"x": "y"}), any_step_output("b", {"x": "y"})
    assert first != second and {**first, "step": "b"} == second


@pytest.mark.parametrize("step", [None, ""])
def test_a_request_naming_no_step_is_refused(step):
    with pytest.raises(BadRequest, match="X-Ninelives-Step"):
        step_output(step, {"title": "t"})


# --- any prompt ------------------------------------------------------------------------------------

def prompt(*texts, model="gpt-test", **fields) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": t} for t in texts], **fields}


def test_a_document_step_asked_in_json_keeps_its_own_output_and_its_prompt_tokens():
    request = {"model": "m", "messages": [{"role": "system", "content": "step: verify"},
                                          {"role": "user", "content": '{"title": "t"}'}]}
    content, prompt_tokens = reply(request, "verify", None)
    assert json.loads(content) == {"ok": True, "reason": "ok"}
    assert prompt_tokens == math.ceil(len("step: verify" + '{"title": "t"}') / 4)


@pytest.mark.parametrize("step", [None, "fetch", "extract", "verify"])
def test_a_prompt_in_prose_is_answered_from_a_hash_of_model_and_messages(step):
    content, prompt_tokens = reply(prompt("Write a haiku about durable queues."), step, None)
    assert content == free_form(prompt("Write a haiku about durable queues."))
    assert content.startswith("Fake answer ") and '"Write a haiku about durable queues."' in content
    assert prompt_tokens == tokens("Write a haiku about durable queues.")
    assert reply(prompt("Write a haiku about durable queues."), step, None)[0] == content
    assert reply(prompt("Write a haiku about durable queues.", model="other"), step, None)[0] != content
    assert reply(prompt("Write a haiku about durable queues!"), step, None)[0] != content


def test_a_free_form_answer_is_json_when_the_request_asks_for_json():
    request = prompt("one two three", response_format={"type": "json_object"})
    answer = json.loads(reply(request, None, None)[0])
    assert answer == {"digest": digest({"model": "gpt-test", "messages": request["messages"]}),
                      "summary": "one two three", "words": 3}


def test_content_faults_apply_to_a_free_form_answer():
    assert json.loads(reply(prompt("hi"), None, "schema")[0]) == {"unexpected": True}
    assert reply(prompt("hi"), None, "bad_content")[0].startswith("Sure! Here is the JSON")


@pytest.mark.parametrize("request_body", [None, [], "text", {"model": "m"}, {"messages": []},
                                          {"messages": "hi"}])
def test_a_body_that_is_no_chat_request_is_refused(request_body):
    with pytest.raises(BadRequest):
        reply(request_body, None, None)


@pytest.mark.parametrize("content", ["", "one", "  lead and trail  ", "a\nb\n\nc", '{"k": "v w"}'])
def test_a_stream_is_cut_in_pieces_that_join_back_to_the_content(content):
    parts = pieces(content)
    assert "".join(parts) == content and all(parts)
    assert len(parts) == len(content.split()) or not content.strip()


# --- attribution -----------------------------------------------------------------------------------

def test_call_attribution_prefers_headers_then_metadata_then_user_then_the_prompt():
    request = {"metadata": {"job": "m-job", "step": "m-step", "worker": "m-w"}, "user": "u-job"}
    headers = {"X-Ninelives-Job": "h-job", "X-Ninelives-Step": "h-step", "X-Ninelives-Worker": "h-w"}
    assert call_attribution(headers, request, "p-step") == {
        "job": "h-job", "step": "h-step", "worker": "h-w", "attributed": "headers"}
    assert call_attribution({}, request, "p-step") == {
        "job": "m-job", "step": "m-step", "worker": "m-w", "attributed": "body"}
    assert call_attribution({}, {"user": "u-job", "metadata": {"job": ""}}, "p-step") == {
        "job": "u-job", "step": "p-step", "worker": None, "attributed": "body"}
    assert call_attribution({}, None, None) == {
        "job": None, "step": None, "worker": None, "attributed": "none"}


def test_call_attribution_ignores_fields_that_name_nothing():
    request = {"metadata": ["not", "an", "object"], "user": {"id": 1}}
    assert call_attribution({"X-Ninelives-Job": " "}, request, None)["attributed"] == "none"
    assert call_attribution({}, {"metadata": {"job": 42, "step": True}}, None) == {
        "job": "42", "step": None, "worker": None, "attributed": "body"}


def test_effect_attribution_prefers_headers_then_the_body_field_by_field():
    body = {"job": "b-job", "kind": "b-kind", "worker": "b-w"}
    assert effect_attribution({"X-Ninelives-Kind": "h-kind", "Idempotency-Key": "k"}, body) == {
        "key": "k", "job": "b-job", "kind": "h-kind", "worker": "b-w", "attributed": "body"}
    assert effect_attribution({"X-Ninelives-Job": "h-job"}, body)["attributed"] == "headers"
    assert effect_attribution({}, ["a", "list"]) == {
        "key": None, "job": None, "kind": None, "worker": None, "attributed": "none"}


# --- completion ------------------------------------------------------------------------------------

@pytest.mark.parametrize("outcome, completion", [
    ("ok", "ok"), ("error", "fail"), ("garbage", "fail"), ("bad_content", "fail"), ("schema", "fail"),
    ("hang", "info"), ("reset", "info"), ("cut", "info"),
])
def test_provider_outcomes_map_to_completions(outcome, completion):
    assert call_completion(outcome) == completion


@pytest.mark.parametrize("outcome, fault, completion", [
    ("applied", None, "ok"), ("replayed", None, "ok"), ("conflict", None, "fail"),
    ("error", {"kind": "status"}, "fail"), ("error", None, "fail"),
    ("dropped", {"kind": "drop"}, "info"), ("applied_late", {"kind": "timeout"}, "info"),
    ("replayed", {"kind": "timeout"}, "info"),
])
def test_receiver_outcomes_map_to_completions(outcome, fault, completion):
    assert effect_completion(outcome, fault) == completion


def test_a_timed_outage_refuses_every_call_in_its_window_and_defers_outside_it():
    from chaos.fakes import ScriptedFaults
    from chaos.fakes.provider import TimedOutage
    inner = ScriptedFaults(provider={("j", "fetch", 2): {"kind": "reset"}})
    now = time.time()
    down = TimedOutage(60.0, start=now - 1.0, inner=inner)
    assert down.down() and not down.down(now + 60.0) and not down.down(now - 2.0)
    assert down.provider_fault("j", "fetch", 2) == {"kind": "status", "status": 503,
                                                    "retry_after": None}
    over = TimedOutage(1.0, start=now - 2.0, inner=inner)
    assert over.provider_fault("j", "fetch", 1) is None
    assert over.provider_fault("j", "fetch", 2) == {"kind": "reset"}
    first = TimedOutage(5.0)  # no start: down from the first call on
    assert first.down(now + 100.0) and first.down(now + 104.0) and not first.down(now + 105.0)
    for seconds in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="outage"):
            TimedOutage(seconds)


# -- tying the fakes' requests to the harness's processes (chaos.collect.attribute_callers) --

class _SlotEngine:
    """An adapter whose worker ids name a slot, not a process (as DBOS's executor ids do)."""

    @staticmethod
    def worker_of(spawn):
        return f"{spawn['role']}-{spawn['slot']}"


class _PidEngine:
    @staticmethod
    def pid_of(worker):
        return int(worker.rsplit(":", 1)[1])


def test_a_request_naming_no_worker_gets_its_callers_process_and_worker():
    from chaos.collect import attribute_callers
    spawned = [{"src": "process", "type": "spawn", "name": "worker-1.4", "role": "worker",
                "slot": 1, "pid": 4242}]
    requests = [{"server": "provider", "worker": None, "caller_pid": 4242},
                {"server": "provider", "worker": None, "caller_pid": 999},   # not ours
                {"server": "provider", "worker": None, "caller_pid": None}]  # caller gone
    attribute_callers(requests, _SlotEngine(), spawned)
    assert [(r.get("worker"), r.get("pid")) for r in requests] == [
        ("worker-1", 4242), (None, None), (None, None)]
    assert all("caller_pid" not in r and "server" not in r for r in requests)


def test_a_request_naming_its_worker_keeps_the_adapters_word_for_its_process():
    from chaos.collect import attribute_callers
    spawned = [{"src": "process", "type": "spawn", "role": "worker", "slot": 0, "pid": 7}]
    requests = [{"worker": "w:host:12", "caller_pid": 7}]
    attribute_callers(requests, _PidEngine(), spawned)
    assert requests == [{"worker": "w:host:12", "pid": 12}]


def test_both_ways_of_finding_a_loopback_socket_name_the_clients_own():
    # The kernel's exact lookup, and the walk over /proc/net/tcp it falls back on.
    import socket
    from chaos.fakes import peer
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, (_, client_port) = server.accept()
            with accepted:
                want = str(os.fstat(client.fileno()).st_ino)
                assert peer._diag_inode(client_port, port) == want
                assert peer._table_inode(client_port, port) == want
                assert peer.PeerFinder().pid_of(("127.0.0.1", client_port), port) == os.getpid()
        assert peer._diag_inode(client_port, port) is None  # closed: no one holds it
