"""The fake provider driven by the official `openai` client, as a user's own pipeline drives it:
free-form prompts answered from a hash of the request, streams as server-sent events billed
for what was streamed, faults surfacing as the client's own errors, no key in the ledger."""

import json
import os

import pytest

import openai  # noqa: E402  a test dependency (the test extra): never skipped

from chaos.fakes import FakeProvider, ScriptedFaults  # noqa: E402
from chaos.fakes.answers import tokens  # noqa: E402

KEY = "test-key"
QUESTION = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Why must a lease be fenced by a token?"}]


@pytest.fixture
def start(tmp_path):
    """Start a fake provider with scripted faults ({(job, step, n): fault}); closed at teardown."""
    started = []

    def _start(faults: dict | None = None) -> FakeProvider:
        fake = FakeProvider(tmp_path / "provider.jsonl",
                            faults=ScriptedFaults(provider=faults) if faults else None)
        started.append(fake.start())
        return fake

    yield _start
    for fake in started:
        fake.close()


@pytest.fixture
def provider(start):
    return start()


def client_of(fake: FakeProvider) -> "openai.OpenAI":
    # No retries: a fault must reach the test as the client's error, not be retried away.
    return openai.OpenAI(base_url=fake.url, api_key=KEY, max_retries=0, timeout=10.0)


def ask(client, messages=QUESTION, model="gpt-4o-mini", **kwargs):
    return client.chat.completions.create(model=model, messages=messages, **kwargs)


def streamed(client, **kwargs) -> list:
    return list(ask(client, stream=True, **kwargs))


def text_of(chunks) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_a_free_form_prompt_is_answered_and_billed(provider):
    answer = ask(client_of(provider))
    content = answer.choices[0].message.content
    assert content.startswith("Fake answer ") and answer.choices[0].finish_reason == "stop"
    assert answer.usage.completion_tokens == tokens(content)
    assert answer.usage.prompt_tokens == tokens("".join(m["content"] for m in QUESTION))
    [entry] = provider.entries()
    assert (entry["status"], entry["outcome"], entry["completion"]) == (200, "ok", "ok")
    assert (entry["job"], entry["step"], entry["attributed"]) == (None, None, "none")
    assert entry["completion_tokens"] == answer.usage.completion_tokens
    assert entry["billed"] == answer.usage.cost > 0 and entry["completion_id"] == answer.id


def test_the_same_request_gets_the_same_answer_and_another_request_another(provider):
    client = client_of(provider)
    first, again = (ask(client).choices[0].message.content for _ in range(2))
    assert first == again
    assert ask(client, model="gpt-4o").choices[0].message.content != first
    other = [*QUESTION[:1], {"role": "user", "content": "Why must a lease expire?"}]
    assert ask(client, messages=other).choices[0].message.content != first


def test_a_document_step_named_by_a_header_still_gets_its_own_output(provider):
    answer = ask(client_of(provider), messages=[{"role": "user", "content": '{"title": "t"}'}],
                 extra_headers={"X-Ninelives-Step": "verify", "X-Ninelives-Job": "j"})
    assert json.loads(answer.choices[0].message.content) == {"ok": True, "reason": "ok"}
    assert [(e["job"], e["step"]) for e in provider.entries()] == [("j", "verify")]


def test_a_stream_joins_to_the_answer_and_is_billed_once_for_it(provider):
    client = client_of(provider)
    whole = ask(client)
    chunks = streamed(client, stream_options={"include_usage": True})
    assert len(chunks) > 3 and {c.object for c in chunks} == {"chat.completion.chunk"}
    assert text_of(chunks) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    usage = chunks[-1].usage  # the last chunk, asked for by include_usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (whole.usage.prompt_tokens,
                                                              whole.usage.completion_tokens)
    plain, stream = provider.entries()
    assert stream["stream"] is True and "stream" not in plain
    assert stream["chunks_sent"] == stream["chunks"] == len(chunks) - 3  # role, finish, usage
    assert (stream["outcome"], stream["completion"], stream["status"]) == ("ok", "ok", 200)
    assert (stream["prompt_tokens"], stream["completion_tokens"], stream["billed"]) == (
        plain["prompt_tokens"], plain["completion_tokens"], plain["billed"])


def test_a_stream_without_include_usage_ends_with_its_finish_chunk(provider):
    chunks = streamed(client_of(provider))
    assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].usage is None
    assert chunks[0].choices[0].delta.role == "assistant"


def test_a_stream_cut_midway_is_billed_for_the_pieces_sent_and_the_ledger_says_so(start):
    provider = start({(None, None, 1): {"kind": "cut", "after": 3}})
    client = client_of(provider)
    received = []
    with pytest.raises(openai.APIConnectionError):
        for chunk in ask(client, stream=True):
            received.append(chunk)
    assert len(received) == 1 + 3  # the role, then three pieces
    sent = text_of(received)
    assert text_of(streamed(client)).startswith(sent)  # the next call streams it whole
    cut, whole = provider.entries()
    assert (cut["outcome"], cut["completion"], cut["fault"]) == ("cut", "info", "cut")
    assert (cut["chunks_sent"], cut["chunks"]) == (3, whole["chunks"])
    assert cut["completion_tokens"] == tokens(sent) < whole["completion_tokens"]
    assert 0 < cut["billed"] < whole["billed"]


def test_a_429_surfaces_as_a_rate_limit_error_plain_or_streamed(start):
    provider = start({("job-1", None, 1): {"kind": "status", "status": 429, "retry_after": 0.5},
                      ("job-1", None, 2): {"kind": "status", "status": 429}})
    client = client_of(provider)
    with pytest.raises(openai.RateLimitError) as refused:
        ask(client, user="job-1")
    assert refused.value.response.headers["retry-after"] == "0.5"
    with pytest.raises(openai.RateLimitError):
        streamed(client, user="job-1")
    assert ask(client, user="job-1").choices[0].message.content.startswith("Fake answer")
    refusals, answered = provider.entries()[:2], provider.entries()[2]
    assert [(e["job"], e["status"], e["billed"], e["completion"]) for e in refusals] == [
        ("job-1", 429, 0.0, "fail")] * 2
    assert (answered["status"], answered["completion"]) == (200, "ok") and answered["billed"] > 0


def test_a_hung_stream_times_the_client_out_and_is_still_billed(start):
    provider = start({("job-h", None, 1): {"kind": "hang", "seconds": 30.0}})
    client = openai.OpenAI(base_url=provider.url, api_key=KEY, max_retries=0, timeout=0.3)
    with pytest.raises(openai.APITimeoutError):
        streamed(client, user="job-h")
    provider.close()  # cuts the hang short; the call is ledgered before close returns
    [entry] = provider.entries()
    assert (entry["outcome"], entry["completion"], entry["stream"]) == ("hang", "info", True)
    # the client left before the first piece: billed for its prompt, and for no piece
    assert (entry["chunks_sent"], entry["completion_tokens"]) == (0, 0) and entry["billed"] > 0
    assert entry["client_gone_at"] >= entry["t_start"]


def test_the_api_key_never_reaches_the_ledger(provider, tmp_path):
    client = client_of(provider)
    ask(client)
    streamed(client)
    assert all(e["auth"] is True for e in provider.entries())
    assert KEY not in (tmp_path / "provider.jsonl").read_text()


def test_a_trickling_hang_keeps_a_stream_alive_past_the_clients_read_timeout(start):
    provider = start({("job-t", None, 1): {"kind": "hang", "seconds": 1.2, "trickle": True}})
    # the client's timeout bounds each read, not the call: the comment lines keep it waiting
    client = openai.OpenAI(base_url=provider.url, api_key=KEY, max_retries=0, timeout=0.5)
    chunks = streamed(client, user="job-t")
    assert text_of(chunks) == ask(client).choices[0].message.content
    entry = provider.entries()[0]
    assert (entry["outcome"], entry["trickle"], entry["client_gone_at"]) == ("hang", True, None)
    assert entry["t_end"] - entry["t_start"] >= 1.2 and entry["chunks_sent"] == entry["chunks"]


def test_a_call_the_fake_cannot_ledger_reaches_the_client_as_an_error_never_an_answer():
    with FakeProvider("/dev/full") as provider:  # every ledger line fails, as on a full disk
        client = client_of(provider)
        with pytest.raises(openai.InternalServerError, match="could not write its ledger"):
            ask(client)
        with pytest.raises(openai.APIConnectionError):  # its head was sent: the stream is cut
            streamed(client)
