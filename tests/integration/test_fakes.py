"""The fakes of the outside world, exercised over real HTTP on 127.0.0.1: answers, billing, ledgers,
every injected fault, idempotency under concurrency, and the `python -m chaos.fakes` entry point."""

import email.utils
import hashlib
import http.client
import json
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, namedtuple
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from chaos.fakes import FakeProvider, FakeReceiver, Ledger, ScriptedFaults, read_ledger
from chaos.fakes.receiver import apply_status

REPO = Path(__file__).resolve().parents[2]
Reply = namedtuple("Reply", "status headers body")


# --- helpers ---------------------------------------------------------------------------------------

def call(url, method="POST", document=None, raw=None, headers=None, timeout=5.0) -> Reply:
    """One HTTP request on a fresh connection; connection errors and timeouts propagate."""
    parts = urlsplit(url)
    body = raw if raw is not None else None if document is None else json.dumps(document).encode()
    sent = {"Content-Type": "application/json"}
    sent.update({name: value for name, value in (headers or {}).items() if value is not None})
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request(method, parts.path, body=body, headers=sent)
        response = conn.getresponse()
        return Reply(response.status, response.headers, response.read())
    finally:
        conn.close()


def chat_request(step, step_input, system=None) -> dict:
    system = f"step: {step}\nAnswer with one JSON object." if system is None else system
    return {"model": "test-model", "response_format": {"type": "json_object"},
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": json.dumps(step_input)}]}


def chat(provider, step, step_input, job="job-1", worker="w1", timeout=5.0, **kwargs) -> Reply:
    headers = {"Authorization": "Bearer sk-test", "X-Ninelives-Job": job,
               "X-Ninelives-Step": step, "X-Ninelives-Worker": worker}
    return call(provider.url + "/chat/completions", document=chat_request(step, step_input, **kwargs),
                headers=headers, timeout=timeout)


def plain_chat(provider, document, headers=None, timeout=5.0) -> Reply:
    """A completion request as an unmodified OpenAI client sends it: no X-Ninelives headers."""
    return call(provider.url + "/chat/completions", document=document,
                headers={"Authorization": "Bearer sk-test", **(headers or {})}, timeout=timeout)


def content_of(reply: Reply) -> str:
    return json.loads(reply.body)["choices"][0]["message"]["content"]


def effect(receiver, body, key=None, job="job-1", kind="payment", timeout=5.0) -> Reply:
    headers = {"Idempotency-Key": key, "X-Ninelives-Job": job, "X-Ninelives-Kind": kind,
               "X-Ninelives-Worker": "w1"}
    return call(receiver.url, document=body, headers=headers, timeout=timeout)


def wait_for(condition, timeout=5.0, what="condition"):
    """Poll `condition` until it returns something truthy; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def ledger_entry(fake, outcome):
    return wait_for(lambda: [e for e in fake.entries() if e["outcome"] == outcome],
                    what=f"a ledger entry with outcome {outcome!r}")[0]


@pytest.fixture
def start(tmp_path):
    """Start fakes with ledgers in tmp_path; all are closed at teardown."""
    started = []

    def _start(cls, faults=None, **kwargs):
        fake = cls(tmp_path / f"{cls.__name__}-{len(started)}.jsonl", faults=faults, **kwargs).start()
        started.append(fake)
        return fake

    yield _start
    for fake in started:
        fake.close()


# --- ledger ----------------------------------------------------------------------------------------

def test_ledger_numbers_entries_skips_a_torn_tail_and_continues_after_reopen(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with Ledger(path, fsync=True) as ledger:
        assert ledger.append({"b": 2, "a": 1}) == {"a": 1, "b": 2, "seq": 1}
        ledger.append({"a": 3})
    assert path.read_text().splitlines()[0] == '{"a": 1, "b": 2, "seq": 1}'  # sorted keys
    with open(path, "a") as f:
        f.write('{"a": 4, "se')  # a writer killed mid-line
    assert [e["seq"] for e in read_ledger(path)] == [1, 2]
    with Ledger(path) as reopened:
        assert reopened.append({"a": 5})["seq"] == 3
    assert [e["a"] for e in read_ledger(path)] == [1, 3, 5]


def test_ledger_appends_from_many_threads_keep_seq_unique_and_lines_whole(tmp_path):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    threads = [threading.Thread(target=lambda t=t: [ledger.append({"t": t, "i": i}) for i in range(50)])
               for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ledger.close()
    assert [e["seq"] for e in ledger.entries()] == list(range(1, 401))
    with pytest.raises(ValueError):
        ledger.append({"late": True})


# --- provider: answers, usage, ledger ------------------------------------------------------------

def test_fetch_collapses_whitespace_and_reports_usage_at_the_configured_price(start):
    provider = start(FakeProvider, price_per_1k=(0.01, 0.02))
    job = {"doc_id": "d1", "title": "Quarterly report", "body": "  Alpha\n\tbeta   gamma  "}
    reply = chat(provider, "fetch", job)
    assert reply.status == 200
    completion = json.loads(reply.body)
    assert completion["object"] == "chat.completion" and completion["model"] == "test-model"
    assert completion["choices"][0]["finish_reason"] == "stop"
    content = content_of(reply)
    assert json.loads(content) == {"title": "Quarterly report", "text": "Alpha beta gamma", "chars": 16}
    assert content == json.dumps(json.loads(content), sort_keys=True)
    request = chat_request("fetch", job)
    prompt = math.ceil(len(request["messages"][0]["content"] + request["messages"][1]["content"]) / 4)
    answer = math.ceil(len(content) / 4)
    assert completion["usage"] == {"prompt_tokens": prompt, "completion_tokens": answer,
                                   "total_tokens": prompt + answer,
                                   "cost": round(prompt / 1000 * 0.01 + answer / 1000 * 0.02, 8)}


def test_fetch_treats_missing_title_and_body_as_empty(start):
    reply = chat(start(FakeProvider), "fetch", {"doc_id": "d2"})
    assert json.loads(content_of(reply)) == {"title": "", "text": "", "chars": 0}


def test_extract_counts_words_entities_and_amount(start):
    text = "Alice met Bob, then alice met Bob again in Paris. Carol? Dave! Eve and Frank."
    reply = chat(start(FakeProvider), "extract", {"title": "Memo", "text": text, "chars": len(text)})
    assert json.loads(content_of(reply)) == {
        "title": "Memo", "words": 15, "entities": ["Alice", "Bob", "Paris", "Carol", "Dave"],
        "amount_cents": sum(ord(c) for c in text) % 100000}


@pytest.mark.parametrize("title, expected", [
    ("Memo", {"ok": True, "reason": "ok"}),
    ("Memo [[needs-review]]", {"ok": False, "reason": "flagged for review"}),
])
def test_verify_flags_titles_marked_for_review(start, title, expected):
    extracted = {"title": title, "words": 1, "entities": [], "amount_cents": 7}
    assert json.loads(content_of(chat(start(FakeProvider), "verify", extracted))) == expected


def test_step_comes_from_the_system_prompt_when_headers_are_absent(start):
    provider = start(FakeProvider)
    reply = call(provider.url + "/chat/completions", document=chat_request("verify", {"title": "x"}))
    assert json.loads(content_of(reply)) == {"ok": True, "reason": "ok"}
    [entry] = provider.entries()
    assert (entry["job"], entry["step"], entry["worker"], entry["auth"]) == (None, "verify", None, False)
    assert entry["attributed"] == "none"
    assert provider.calls_for(None, "verify") == 1


CALLER = """
import http.client, json, sys
conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=5)
for path, body in (("/v1/chat/completions", sys.argv[2]), ("/v1/effects", sys.argv[3])):
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    conn.getresponse().read()
    conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[4]), timeout=5)
"""


def test_both_fakes_ledger_the_process_on_the_other_end_of_the_socket(start):
    # A plain client in its own process, naming no worker: each fake finds it by its socket.
    provider, receiver = start(FakeProvider), start(FakeReceiver)
    chat_body = json.dumps(chat_request("verify", {"title": "x"}))
    effect_body = json.dumps({"job": "job-1", "kind": "payment"})
    caller = subprocess.Popen([sys.executable, "-c", CALLER, str(provider.port), chat_body,
                               effect_body, str(receiver.port)])
    assert caller.wait(timeout=20) == 0
    [asked] = provider.entries()
    assert asked["caller_pid"] == caller.pid and asked["worker"] is None
    [sent] = wait_for(receiver.entries, what="the receiver's ledger line")
    assert sent["caller_pid"] == caller.pid
    chat(provider, "verify", {"title": "y"})  # and this process, for a call from here
    assert provider.entries()[-1]["caller_pid"] == os.getpid()


def test_step_header_wins_over_the_system_prompt(start):
    text_input = {"title": "t", "text": "One Two", "chars": 7}
    reply = chat(start(FakeProvider), "extract", text_input, system="step: verify\nIgnore me.")
    assert json.loads(content_of(reply))["entities"] == ["One", "Two"]


def test_ledger_counts_calls_per_job_and_step(start):
    provider = start(FakeProvider)
    for job, step in [("a", "fetch"), ("a", "fetch"), ("b", "fetch"), ("a", "verify"), ("a", "fetch")]:
        assert chat(provider, step, {"title": "t"}, job=job, worker=f"w-{job}").status == 200
    entries = provider.entries()
    assert [(e["job"], e["step"], e["n"]) for e in entries] == [
        ("a", "fetch", 1), ("a", "fetch", 2), ("b", "fetch", 1), ("a", "verify", 1), ("a", "fetch", 3)]
    assert [e["seq"] for e in entries] == [1, 2, 3, 4, 5]
    assert provider.calls_for("a", "fetch") == 3 and provider.calls_for("b", "verify") == 0
    first = entries[0]
    assert first["server"] == "provider" and first["worker"] == "w-a" and first["auth"] is True
    assert first["outcome"] == "ok" and first["status"] == 200 and first["fault"] is None
    assert (first["completion"], first["attributed"]) == ("ok", "headers")
    assert first["billed"] > 0 and first["prompt_tokens"] > 0 and first["completion_tokens"] > 0
    assert first["t_start"] <= first["t_end"] <= time.time()


@pytest.mark.parametrize("raw, step", [
    (b"{not json", "fetch"),
    (json.dumps({"model": "m", "messages": []}).encode(), "fetch"),
    (json.dumps({"model": "m"}).encode(), None),
    (json.dumps([{"role": "user", "content": "a list, not a request"}]).encode(), None),
])
def test_bad_requests_are_refused_with_400_and_not_billed(start, raw, step):
    provider = start(FakeProvider)
    reply = call(provider.url + "/chat/completions", raw=raw, headers={"X-Ninelives-Step": step})
    assert reply.status == 400
    assert json.loads(reply.body)["error"]["type"] == "invalid_request_error"
    assert set(json.loads(reply.body)["error"]) == {"message", "type", "code"}
    [entry] = provider.entries()
    assert (entry["outcome"], entry["status"], entry["billed"]) == ("error", 400, 0.0)
    assert entry["completion"] == "fail"


@pytest.mark.parametrize("document, step", [
    ({"model": "m", "messages": [{"role": "user", "content": "plain words"}]}, "fetch"),
    (chat_request("summarize", {"title": "t"}, system="Summarize."), None),
])
def test_a_prompt_naming_no_step_or_a_document_step_in_prose_is_answered_and_billed(start, document,
                                                                                   step):
    provider = start(FakeProvider)
    first, again = (call(provider.url + "/chat/completions", document=document,
                         headers={"X-Ninelives-Step": step}) for _ in range(2))
    assert (first.status, again.status) == (200, 200)
    assert content_of(first) == content_of(again)  # from a hash of model and messages
    assert [(e["step"], e["outcome"], e["completion"]) for e in provider.entries()] == [
        (step, "ok", "ok")] * 2
    assert all(e["billed"] > 0 and e["completion_tokens"] > 0 for e in provider.entries())


# --- provider: any other step ----------------------------------------------------------------------

def test_an_unknown_step_is_answered_from_its_name_and_its_input(start):
    provider = start(FakeProvider)
    step_input = {"b": ["Rust  and", {"z": "Go"}], "a": "Hello world", "n": 3}
    first = chat(provider, "summarize", step_input)
    assert first.status == 200
    canonical = json.dumps(step_input, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert json.loads(content_of(first)) == {
        "step": "summarize", "digest": hashlib.sha256(canonical.encode()).hexdigest()[:16],
        "summary": "Hello world Rust and Go", "words": 5}
    again = chat(provider, "summarize", dict(reversed(step_input.items())))  # same object, other order
    assert content_of(again) == content_of(first)
    other = json.loads(content_of(chat(provider, "summarize", {**step_input, "n": 4})))
    assert other["digest"] != json.loads(content_of(first))["digest"]
    assert [(e["step"], e["outcome"], e["completion"]) for e in provider.entries()] == [
        ("summarize", "ok", "ok")] * 3
    assert all(e["billed"] > 0 for e in provider.entries())


def test_an_unknown_step_takes_a_prose_prompt_and_long_inputs_are_summarized_short(start):
    provider = start(FakeProvider)
    prose = " ".join(f"w{i}" for i in range(30))
    reply = plain_chat(provider, {"model": "m", "messages": [
        {"role": "system", "content": "step: classify\nSay what this is."},
        {"role": "user", "content": [{"type": "text", "text": prose}]}]})
    answer = json.loads(content_of(reply))
    assert answer["step"] == "classify" and answer["words"] == 30
    assert answer["summary"] == " ".join(f"w{i}" for i in range(12))
    assert answer["digest"] == hashlib.sha256(json.dumps(prose).encode()).hexdigest()[:16]


def test_faults_land_on_an_unknown_step_too(start):
    provider = start(FakeProvider, ScriptedFaults(provider={("j", "rank", 1): {"kind": "schema"}}))
    assert json.loads(content_of(chat(provider, "rank", {"q": "x"}, job="j"))) == {"unexpected": True}
    assert json.loads(content_of(chat(provider, "rank", {"q": "x"}, job="j")))["step"] == "rank"


# --- provider: attribution -------------------------------------------------------------------------

def test_a_plain_client_is_attributed_by_its_metadata(start):
    faults = ScriptedFaults(provider={("job-m", "rank", 1): {"kind": "status", "status": 429}})
    provider = start(FakeProvider, faults)
    document = {**chat_request("rank", {"q": "x"}, system="Rank these."),
                "metadata": {"job": "job-m", "step": "rank", "worker": "w-m"}, "user": "someone-else"}
    assert plain_chat(provider, document).status == 429  # the fault keyed on the job found it
    assert plain_chat(provider, document).status == 200
    assert [(e["job"], e["step"], e["worker"], e["n"], e["attributed"]) for e in provider.entries()] == [
        ("job-m", "rank", "w-m", 1, "body"), ("job-m", "rank", "w-m", 2, "body")]
    assert provider.calls_for("job-m", "rank") == 2 and faults.unfired() == []


def test_a_plain_client_is_attributed_by_its_user_and_the_system_prompt(start):
    provider = start(FakeProvider)
    reply = plain_chat(provider, {**chat_request("rank", {"q": "x"}), "user": "job-u"})
    assert json.loads(content_of(reply))["step"] == "rank"
    [entry] = provider.entries()
    assert (entry["job"], entry["step"], entry["worker"], entry["attributed"]) == (
        "job-u", "rank", None, "body")


def test_headers_take_precedence_over_metadata_and_user(start):
    provider = start(FakeProvider)
    document = {**chat_request("verify", {"title": "t"}, system="step: fetch\n"),
                "metadata": {"job": "job-m", "step": "extract", "worker": "w-m"}, "user": "job-u"}
    headers = {"X-Ninelives-Job": "job-h", "X-Ninelives-Step": "verify", "X-Ninelives-Worker": "w-h"}
    reply = plain_chat(provider, document, headers=headers)
    assert json.loads(content_of(reply)) == {"ok": True, "reason": "ok"}  # answered as verify
    [entry] = provider.entries()
    assert (entry["job"], entry["step"], entry["worker"], entry["attributed"]) == (
        "job-h", "verify", "w-h", "headers")


def test_metadata_step_wins_over_the_system_prompt(start):
    provider = start(FakeProvider)
    document = {**chat_request("verify", {"title": "t"}), "metadata": {"step": "fetch"}}
    assert json.loads(content_of(plain_chat(provider, document))) == {"title": "t", "text": "", "chars": 0}


def test_models_and_healthz_answer(start):
    provider = start(FakeProvider)
    models = call(provider.url + "/models", method="GET")
    assert json.loads(models.body) == {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}
    assert call(f"http://127.0.0.1:{provider.port}/healthz", method="GET").status == 200
    assert provider.entries() == []


# --- provider: faults ------------------------------------------------------------------------------

@pytest.mark.parametrize("status, retry_after, header", [
    (429, 1.5, "1.5"), (429, None, None), (500, None, None), (502, 2, "2"), (503, 0.25, "0.25"),
    (400, None, None),
])
def test_status_faults_answer_an_openai_error_unbilled_then_recover(start, status, retry_after, header):
    fault = {"kind": "status", "status": status, "retry_after": retry_after}
    provider = start(FakeProvider, ScriptedFaults(provider={("j", "fetch", 1): fault}))
    reply = chat(provider, "fetch", {"title": "t"}, job="j")
    assert reply.status == status
    assert reply.headers.get("Retry-After") == header
    assert set(json.loads(reply.body)["error"]) == {"message", "type", "code"}
    assert chat(provider, "fetch", {"title": "t"}, job="j").status == 200  # n=2 is not scripted
    failed, recovered = provider.entries()
    assert (failed["outcome"], failed["status"], failed["billed"], failed["fault"]) == (
        "error", status, 0.0, "status")
    assert (recovered["n"], recovered["outcome"]) == (2, "ok")
    assert (failed["completion"], recovered["completion"]) == ("fail", "ok")


def test_a_retry_after_as_an_http_date_is_never_earlier_than_its_seconds(start):
    fault = {"kind": "status", "status": 429, "retry_after": 1.5, "retry_after_form": "date"}
    provider = start(FakeProvider, ScriptedFaults(provider={("j", "fetch", 1): fault}))
    sent = time.time()
    reply = chat(provider, "fetch", {"title": "t"}, job="j")
    assert reply.status == 429
    header = reply.headers.get("Retry-After")
    when = email.utils.parsedate_to_datetime(header).timestamp()  # an RFC 9110 HTTP date
    [entry] = provider.entries()
    assert (entry["retry_after"], entry["retry_at"], entry["retry_after_header"]) == (
        1.5, when, header)
    assert when == int(when) and when >= entry["t_start"] + 1.5  # whole seconds, rounded up
    assert sent + 1.5 <= when <= time.time() + 2.5


@pytest.mark.parametrize("status", [429, 503])
def test_an_unparseable_retry_after_is_sent_and_ledgered_as_no_guidance(start, status):
    fault = {"kind": "status", "status": status, "retry_after": None, "retry_after_form": "junk"}
    provider = start(FakeProvider, ScriptedFaults(provider={("j", "fetch", 1): fault}))
    reply = chat(provider, "fetch", {"title": "t"}, job="j")
    assert (reply.status, reply.headers.get("Retry-After")) == (status, "soon")
    [entry] = provider.entries()
    assert (entry["retry_after"], entry["retry_after_header"]) == (None, "soon")
    assert "retry_at" not in entry


def trickle_fault(seconds=1.6):
    return ScriptedFaults(provider={("j", "fetch", 1): {"kind": "hang", "seconds": seconds,
                                                         "trickle": True}})


def test_a_trickling_hang_holds_a_client_that_bounds_only_each_socket_read(start):
    provider = start(FakeProvider, trickle_fault())
    parts = urlsplit(provider.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=0.5)
    began = time.monotonic()
    try:
        conn.request("POST", parts.path + "/chat/completions",
                     body=json.dumps(chat_request("fetch", {"title": "t"})).encode(),
                     headers={"Content-Type": "application/json", "X-Ninelives-Job": "j",
                              "X-Ninelives-Step": "fetch"})
        response = conn.getresponse()
        assert response.status == 200 and time.monotonic() - began < 0.5  # headers at once
        body = response.read()  # no read waits 0.5 s: a byte comes every 0.2 s
    finally:
        conn.close()
    took = time.monotonic() - began
    assert took > 1.0, f"the answer took only {took:.2f} s"
    assert json.loads(content_of(Reply(200, None, body)))["title"] == "t"
    entry = ledger_entry(provider, "hang")
    assert (entry["trickle"], entry["client_gone_at"], entry["completion"]) == (True, None, "info")
    assert entry["t_end"] - entry["t_start"] >= 1.6 and entry["billed"] > 0


def test_a_trickling_hang_is_cut_by_a_whole_exchange_deadline(start):
    from engine import CallTimeout
    from engine.http import post_json
    provider = start(FakeProvider, trickle_fault())
    began = time.monotonic()
    with pytest.raises(CallTimeout):
        post_json(provider.url + "/chat/completions", chat_request("fetch", {"title": "t"}),
                  {"X-Ninelives-Job": "j", "X-Ninelives-Step": "fetch"}, timeout=0.5)
    assert time.monotonic() - began < 0.5 + 0.4
    entry = ledger_entry(provider, "hang")
    # the fake holds the call to the end, as any hang, and saw the client leave long before
    assert entry["trickle"] is True and entry["t_end"] - entry["t_start"] >= 1.6
    assert entry["client_gone_at"] is not None
    assert entry["client_gone_at"] - entry["t_start"] < 1.5
    assert entry["completion"] == "info"


def test_hang_bills_the_call_while_the_client_times_out(start):
    faults = ScriptedFaults(provider={("j", "fetch", 1): {"kind": "hang", "seconds": 0.6}})
    provider = start(FakeProvider, faults)
    with pytest.raises(TimeoutError):
        chat(provider, "fetch", {"title": "t", "body": "b"}, job="j", timeout=0.3)
    entry = ledger_entry(provider, "hang")
    assert entry["status"] == 200 and entry["billed"] > 0 and entry["completion_tokens"] > 0
    assert entry["completion"] == "info"  # billed, answered 200, and still never seen by the caller
    assert entry["t_end"] - entry["t_start"] >= 0.6


def test_close_cuts_an_injected_hang_short_and_still_ledgers_it(tmp_path):
    faults = ScriptedFaults(provider={("j", "fetch", 1): {"kind": "hang", "seconds": 30}})
    provider = FakeProvider(tmp_path / "p.jsonl", faults=faults).start()
    try:
        with pytest.raises(TimeoutError):
            chat(provider, "fetch", {"title": "t"}, job="j", timeout=0.2)
    finally:
        began = time.monotonic()
        provider.close()
    assert time.monotonic() - began < 3
    assert [e["outcome"] for e in provider.entries()] == ["hang"]


def test_slow_answers_correctly_after_the_delay(start):
    faults = ScriptedFaults(provider={("j", "verify", 1): {"kind": "slow", "seconds": 0.2}})
    provider = start(FakeProvider, faults)
    began = time.monotonic()
    reply = chat(provider, "verify", {"title": "t"}, job="j")
    assert time.monotonic() - began >= 0.2
    assert json.loads(content_of(reply)) == {"ok": True, "reason": "ok"}
    [entry] = provider.entries()
    assert (entry["outcome"], entry["fault"]) == ("ok", "slow") and entry["billed"] > 0
    assert entry["completion"] == "ok"  # the client waited: it had the answer


def test_slow_answer_to_a_client_that_gave_up_is_indeterminate(start):
    faults = ScriptedFaults(provider={("j", "verify", 1): {"kind": "slow", "seconds": 0.6}})
    provider = start(FakeProvider, faults)
    with pytest.raises(TimeoutError):
        chat(provider, "verify", {"title": "t"}, job="j", timeout=0.2)
    entry = wait_for(provider.entries, what="the slow call's ledger entry")[0]
    assert (entry["outcome"], entry["status"], entry["completion"]) == ("ok", 200, "info")


def test_reset_is_seen_by_the_client_as_a_connection_reset(start):
    provider = start(FakeProvider, ScriptedFaults(provider={("j", "fetch", 1): {"kind": "reset"}}))
    with pytest.raises(ConnectionResetError) as caught:
        chat(provider, "fetch", {"title": "t"}, job="j")
    assert not isinstance(caught.value, http.client.RemoteDisconnected)  # an RST, not a polite close
    entry = ledger_entry(provider, "reset")
    assert entry["status"] is None and entry["billed"] == 0.0
    assert entry["completion"] == "info"


def test_a_cut_completion_ends_midway_through_its_body_and_is_billed_whole(start):
    provider = start(FakeProvider, ScriptedFaults(provider={("j", "fetch", 1): {"kind": "cut"}}))
    with pytest.raises(http.client.IncompleteRead):
        chat(provider, "fetch", {"title": "t"}, job="j")
    whole = chat(provider, "fetch", {"title": "t"}, job="j")
    cut, answered = provider.entries()
    assert (cut["status"], cut["outcome"], cut["completion"]) == (200, "cut", "info")
    assert (cut["billed"], cut["completion_tokens"]) == (answered["billed"],
                                                         answered["completion_tokens"])
    assert json.loads(content_of(whole))["title"] == "t"


def test_garbage_is_a_200_that_is_not_json_and_not_billed(start):
    provider = start(FakeProvider, ScriptedFaults(provider={("j", "fetch", 1): {"kind": "garbage"}}))
    reply = chat(provider, "fetch", {"title": "t"}, job="j")
    assert reply.status == 200
    with pytest.raises(ValueError):
        json.loads(reply.body)
    [entry] = provider.entries()
    assert (entry["outcome"], entry["billed"], entry["completion"]) == ("garbage", 0.0, "fail")


def test_bad_content_is_a_billed_completion_whose_content_is_not_json(start):
    provider = start(FakeProvider, ScriptedFaults(provider={("j", "extract", 1): {"kind": "bad_content"}}))
    reply = chat(provider, "extract", {"title": "t", "text": "Some Text"}, job="j")
    assert reply.status == 200
    with pytest.raises(ValueError):
        json.loads(content_of(reply))
    [entry] = provider.entries()
    assert (entry["outcome"], entry["completion"]) == ("bad_content", "fail")
    assert entry["billed"] == json.loads(reply.body)["usage"]["cost"] > 0


def test_schema_fault_returns_json_that_breaks_the_step_schema(start):
    provider = start(FakeProvider, ScriptedFaults(provider={("j", "verify", 1): {"kind": "schema"}}))
    reply = chat(provider, "verify", {"title": "t"}, job="j")
    assert json.loads(content_of(reply)) == {"unexpected": True}
    [entry] = provider.entries()
    assert entry["outcome"] == "schema" and entry["billed"] > 0 and entry["completion"] == "fail"


def test_scripted_faults_reject_malformed_faults_and_report_unfired_ones():
    with pytest.raises(ValueError):
        ScriptedFaults(provider={("j", "fetch", 1): {"kind": "explode"}})
    with pytest.raises(ValueError):
        ScriptedFaults(receiver={("j", "payment", 1): {"kind": "timeout"}})
    for after in (-1, 1.5, "2", True):
        with pytest.raises(ValueError, match="after"):
            ScriptedFaults(provider={("j", "fetch", 1): {"kind": "cut", "after": after}})
    ScriptedFaults(provider={("j", "fetch", 1): {"kind": "cut"},
                             ("j", "fetch", 2): {"kind": "cut", "after": 0}})
    faults = ScriptedFaults(provider={("j", "fetch", 1): {"kind": "reset"}},
                            receiver={("j", "payment", 2): {"kind": "drop"}})
    assert faults.provider_fault("j", "fetch", 1) == {"kind": "reset"}
    assert faults.receiver_fault("j", "payment", 1) is None
    assert faults.unfired() == [("receiver", ("j", "payment", 2))]


# --- receiver ---------------------------------------------------------------------------------------

def test_same_key_twice_applies_once_and_replays_the_stored_answer(start):
    receiver = start(FakeReceiver)
    first = effect(receiver, {"amount": 100}, key="k1")
    second = effect(receiver, {"amount": 100}, key="k1")
    assert (first.status, json.loads(first.body)) == (apply_status("job-1", "payment", 1),
                                                      {"id": "eff_1", "applied": True})
    assert (second.status, json.loads(second.body)) == (200, {"id": "eff_1", "applied": True})
    assert second.headers.get("Idempotent-Replayed") == "true"
    assert first.headers.get("Idempotent-Replayed") is None
    [applied] = receiver.applied()
    assert (applied["id"], applied["key"], applied["job"], applied["kind"], applied["body"]) == (
        "eff_1", "k1", "job-1", "payment", {"amount": 100})
    assert json.loads(call(receiver.url, method="GET").body)["data"] == receiver.applied()
    assert [(e["outcome"], e["applied"], e["effect_id"], e["n"]) for e in receiver.entries()] == [
        ("applied", True, "eff_1", 1), ("replayed", False, "eff_1", 2)]
    assert [(e["completion"], e["attributed"]) for e in receiver.entries()] == [
        ("ok", "headers"), ("ok", "headers")]


def test_same_key_with_a_different_body_is_a_422_conflict(start):
    receiver = start(FakeReceiver)
    effect(receiver, {"amount": 1}, key="k1")
    reply = effect(receiver, {"amount": True}, key="k1")
    assert (reply.status, json.loads(reply.body)) == (
        422, {"error": "idempotency key reused with a different body"})
    assert len(receiver.applied()) == 1
    assert (receiver.entries()[-1]["outcome"], receiver.entries()[-1]["completion"]) == ("conflict", "fail")


def test_requests_without_a_key_apply_every_time(start):
    receiver = start(FakeReceiver)
    replies = [effect(receiver, {"amount": 5}) for _ in range(2)]
    assert [json.loads(r.body)["id"] for r in replies] == ["eff_1", "eff_2"]
    assert [e["id"] for e in receiver.applied()] == ["eff_1", "eff_2"]
    assert [e["key"] for e in receiver.entries()] == [None, None]


def test_a_body_that_is_not_json_is_refused(start):
    receiver = start(FakeReceiver)
    assert call(receiver.url, raw=b"amount=5", headers={"Idempotency-Key": "k"}).status == 400
    assert receiver.applied() == []
    assert (receiver.entries()[0]["outcome"], receiver.entries()[0]["completion"]) == ("error", "fail")


def test_concurrent_requests_with_one_key_apply_once(start):
    receiver = start(FakeReceiver)
    barrier, statuses, lock = threading.Barrier(20), [], threading.Lock()

    def send():
        barrier.wait()
        status = effect(receiver, {"amount": 42}, key="shared").status
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=send) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    [applied] = [e for e in receiver.entries() if e["outcome"] == "applied"]
    assert Counter(statuses) == Counter([apply_status("job-1", "payment", applied["n"])] + [200] * 19)
    assert len(receiver.applied()) == 1
    assert sorted(e["n"] for e in receiver.entries()) == list(range(1, 21))


def test_applies_answered_200_or_202_still_apply_once_and_replays_still_replay(start):
    receiver = start(FakeReceiver)
    # (job-i, payment, 1) for i in 1..9 draws every status a first apply is answered with
    firsts = [effect(receiver, {"amount": i}, key=f"k{i}", job=f"job-{i}") for i in range(1, 10)]
    want = [apply_status(f"job-{i}", "payment", 1) for i in range(1, 10)]
    assert [r.status for r in firsts] == want and {200, 201, 202} <= set(want)
    assert all(r.headers.get("Idempotent-Replayed") is None for r in firsts)
    replays = [effect(receiver, {"amount": i}, key=f"k{i}", job=f"job-{i}") for i in range(1, 10)]
    assert {r.status for r in replays} == {200}
    assert all(r.headers.get("Idempotent-Replayed") == "true" for r in replays)
    assert [json.loads(r.body) for r in replays] == [json.loads(r.body) for r in firsts]
    assert len(receiver.applied()) == 9
    assert Counter((e["outcome"], e["completion"]) for e in receiver.entries()) == {
        ("applied", "ok"): 9, ("replayed", "ok"): 9}
    assert [e["status"] for e in receiver.entries() if e["outcome"] == "applied"] == want


@pytest.mark.parametrize("status", [500, 502, 503])
def test_status_fault_is_not_applied(start, status):
    faults = ScriptedFaults(receiver={("job-1", "payment", 1): {"kind": "status", "status": status}})
    receiver = start(FakeReceiver, faults)
    assert effect(receiver, {"amount": 9}, key="k").status == status
    assert receiver.applied() == []
    applied = apply_status("job-1", "payment", 2)
    assert effect(receiver, {"amount": 9}, key="k").status == applied  # the key was never used up
    assert [(e["outcome"], e["status"], e["completion"]) for e in receiver.entries()] == [
        ("error", status, "fail"), ("applied", applied, "ok")]


def test_drop_applies_then_the_retry_with_the_same_key_replays(start):
    receiver = start(FakeReceiver, ScriptedFaults(receiver={("job-1", "payment", 1): {"kind": "drop"}}))
    with pytest.raises(ConnectionResetError):
        effect(receiver, {"amount": 3}, key="k")
    dropped = ledger_entry(receiver, "dropped")
    assert (dropped["applied"], dropped["completion"]) == (True, "info")
    retry = effect(receiver, {"amount": 3}, key="k")
    assert retry.status == 200 and retry.headers.get("Idempotent-Replayed") == "true"
    assert len(receiver.applied()) == 1


def test_drop_of_an_already_applied_key_applies_nothing(start):
    receiver = start(FakeReceiver, ScriptedFaults(receiver={("job-1", "payment", 2): {"kind": "drop"}}))
    effect(receiver, {"amount": 3}, key="k")
    with pytest.raises(ConnectionResetError):
        effect(receiver, {"amount": 3}, key="k")
    dropped = ledger_entry(receiver, "dropped")
    assert (dropped["applied"], dropped["completion"]) == (False, "info")  # the sender cannot tell
    assert len(receiver.applied()) == 1


def test_timeout_applies_late_after_the_client_gave_up(start):
    faults = ScriptedFaults(receiver={("job-1", "payment", 1): {"kind": "timeout", "seconds": 0.6}})
    receiver = start(FakeReceiver, faults)
    with pytest.raises(TimeoutError):
        effect(receiver, {"amount": 8}, key="k", timeout=0.3)
    late = ledger_entry(receiver, "applied_late")
    assert (late["status"], late["applied"], late["effect_id"]) == (
        apply_status("job-1", "payment", 1), True, "eff_1")
    assert late["completion"] == "info"
    assert effect(receiver, {"amount": 8}, key="k").status == 200
    assert len(receiver.applied()) == 1


def test_timeout_on_an_already_applied_key_is_a_replay(start):
    faults = ScriptedFaults(receiver={("job-1", "payment", 2): {"kind": "timeout", "seconds": 0.05}})
    receiver = start(FakeReceiver, faults)
    effect(receiver, {"amount": 8}, key="k")
    assert effect(receiver, {"amount": 8}, key="k").status == 200
    assert [e["outcome"] for e in receiver.entries()] == ["applied", "replayed"]
    assert [e["completion"] for e in receiver.entries()] == ["ok", "info"]  # a timeout, replay or not


def test_a_sender_without_headers_is_attributed_by_the_body(start):
    faults = ScriptedFaults(receiver={("job-b", "charge", 1): {"kind": "status", "status": 503}})
    receiver = start(FakeReceiver, faults)
    body = {"job": "job-b", "kind": "charge", "worker": "s-1", "amount_cents": 5}
    assert call(receiver.url, document=body, headers={"Idempotency-Key": "k"}).status == 503
    assert call(receiver.url, document=body, headers={"Idempotency-Key": "k"}).status == \
        apply_status("job-b", "charge", 2)
    assert [(e["job"], e["kind"], e["worker"], e["n"], e["attributed"], e["completion"])
            for e in receiver.entries()] == [("job-b", "charge", "s-1", 1, "body", "fail"),
                                             ("job-b", "charge", "s-1", 2, "body", "ok")]
    [applied] = receiver.applied()
    assert (applied["job"], applied["kind"], applied["worker"]) == ("job-b", "charge", "s-1")


def test_receiver_headers_take_precedence_over_the_body(start):
    receiver = start(FakeReceiver)
    effect(receiver, {"job": "job-b", "kind": "notify", "amount": 1}, key="k", job="job-h", kind="charge")
    call(receiver.url, document={"amount": 1})
    headed, bare = receiver.entries()
    assert (headed["job"], headed["kind"], headed["worker"], headed["attributed"]) == (
        "job-h", "charge", "w1", "headers")
    assert (bare["job"], bare["kind"], bare["worker"], bare["attributed"]) == (None, None, None, "none")


def test_fakes_refuse_to_bind_anywhere_but_loopback(tmp_path):
    with pytest.raises(ValueError):
        FakeReceiver(tmp_path / "r.jsonl", host="0.0.0.0")


# --- entry point -----------------------------------------------------------------------------------

def spawn(server, ledger) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "chaos.fakes", server, "--ledger", str(ledger)],
                            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def read_url(proc, timeout=10.0) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "the fake printed no URL line"
    return json.loads(proc.stdout.readline())["url"]


def test_entry_point_serves_until_its_stdin_closes(tmp_path):
    with spawn("provider", tmp_path / "p.jsonl") as proc:
        try:
            url = read_url(proc)
            assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
            reply = call(url + "/chat/completions", document=chat_request("verify", {"title": "t"}))
            assert json.loads(content_of(reply)) == {"ok": True, "reason": "ok"}
            proc.stdin.close()
            assert proc.wait(timeout=5) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    assert [e["outcome"] for e in read_ledger(tmp_path / "p.jsonl")] == ["ok"]


def test_entry_point_exits_cleanly_on_sigterm(tmp_path):
    with spawn("receiver", tmp_path / "r.jsonl") as proc:
        try:
            url = read_url(proc)
            reply = call(url, document={"amount": 1}, headers={"Idempotency-Key": "k"})
            assert reply.status == apply_status(None, None, 1)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=5) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    assert [e["outcome"] for e in read_ledger(tmp_path / "r.jsonl")] == ["applied"]
