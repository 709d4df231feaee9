"""A completion answered as server-sent events (`stream: true`), as OpenAI streams it: one
`chat.completion.chunk` per piece of the content, then one with `finish_reason`, then (when
`stream_options.include_usage` asks) one with the usage, then `data: [DONE]`.

Written over HTTP/1.1 chunked transfer encoding, as it goes: the client reads each piece as it
is sent, and the connection serves the next request once the stream ends. A stream can be
cut (the connection closed before [DONE]): the client then holds the pieces sent so far, which
are what the provider bills.
"""

import json
import re
import time
from collections.abc import Callable

_PIECE = re.compile(r"\S*\s*")


def pieces(content: str) -> list[str]:
    """`content` in the pieces it is streamed in: a word with the spaces after it (leading
    spaces stay with the first). They join back to `content`."""
    found = [piece for piece in _PIECE.findall(content) if piece]
    if len(found) > 1 and not found[0].strip():
        found[:2] = [found[0] + found[1]]
    return found


class Chunks:
    """The `chat.completion.chunk` documents of one streamed completion."""

    def __init__(self, completion_id: str, model: str, created: int):
        self._base = {"id": completion_id, "object": "chat.completion.chunk",
                      "created": created, "model": model}

    def role(self) -> dict:
        """The first chunk: the assistant's role and no text yet."""
        return self._choice({"role": "assistant", "content": ""}, None)

    def piece(self, text: str) -> dict:
        """A chunk carrying one piece of the content."""
        return self._choice({"content": text}, None)

    def finish(self) -> dict:
        """The chunk that ends the choice."""
        return self._choice({}, "stop")

    def usage(self, usage: dict) -> dict:
        """The last chunk when the request asked for usage: no choice, the usage."""
        return {**self._base, "choices": [], "usage": usage}

    def _choice(self, delta: dict, finish_reason: str | None) -> dict:
        return {**self._base, "choices": [{"index": 0, "delta": delta,
                                           "finish_reason": finish_reason}]}


def wants_usage(request: dict) -> bool:
    """Whether the request's `stream_options` ask for a last chunk with the usage."""
    options = request.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


class EventStream:
    """One 200 answer of server-sent events on a request handler (chaos.fakes.server's
    JsonHandler). `gone_at` is when a write found the client gone (None: it stayed)."""

    def __init__(self, http):
        self.http = http
        self.gone_at: float | None = None

    def open(self) -> bool:
        """Send the status line and headers; return False if the client had already gone
        (then nothing is sent: a client that left before the first piece is billed none)."""
        return self._sent(not self.http.client_gone() and self.http.send_head(200, {
            "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
            "Transfer-Encoding": "chunked"}))

    def event(self, document) -> bool:
        """Send one `data:` event holding `document` as JSON; False once the client is gone."""
        return self._chunk(b"data: " + json.dumps(document).encode() + b"\n\n")

    def send_all(self, documents) -> int:
        """Send `documents`, one event each, until the client is gone; return how many were sent."""
        sent = 0
        for document in documents:
            if not self.event(document):
                break
            sent += 1
        return sent

    def wait(self, seconds: float, interval: float, pause: Callable[[float], bool]) -> None:
        """Hold the stream for `seconds`, sending a comment line (which clients skip) every
        `interval`, as servers keep an idle stream alive: a client that bounds each socket
        read, not the whole exchange, waits it out. `pause(s)` sleeps, True to stop early."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if pause(min(interval, left)):
                return  # the fake is closing
            if self.gone_at is None and deadline > time.monotonic():
                self._chunk(b": waiting\n\n")

    def end(self, documents: list) -> bool:
        """Send the last `documents`, `data: [DONE]` and the end of the body; False if the
        client had gone."""
        for document in documents:
            self.event(document)
        self._chunk(b"data: [DONE]\n\n")
        return self._sent(self.gone_at is None and self.http.send_rest(b"0\r\n\r\n"))

    def cut(self) -> None:
        """End the connection here, before [DONE] and the end of the body."""
        self.http.close_connection = True

    def _chunk(self, data: bytes) -> bool:
        if self.gone_at is not None:
            return False
        return self._sent(self.http.send_rest(b"%x\r\n%s\r\n" % (len(data), data)))

    def _sent(self, ok: bool) -> bool:
        if not ok and self.gone_at is None:
            self.gone_at = time.time()
        return ok
