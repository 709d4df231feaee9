"""A client for an OpenAI-compatible chat-completions endpoint that reads each call's cost."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from .http import post_json
from .retry import ParseError


@dataclass(frozen=True)
class Completion:
    """A parsed answer: the assistant message's JSON content and what the call cost."""

    content: Any
    cost: float
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class ChatClient:
    """POSTs to `{base_url}/chat/completions`; every call has `timeout` seconds at most.

    Cost comes from the response (`usage.cost`, else a top-level `cost`), else from usage
    tokens times the price per 1,000 tokens.
    """

    base_url: str
    model: str
    timeout: float
    key: str = ""
    price_prompt_per_1k: float = 0.0
    price_completion_per_1k: float = 0.0

    def complete(self, system: str, user: str, headers: Mapping[str, str] | None = None) -> Completion:
        """Ask for a JSON object. Raises the retry policy's errors (see engine.http.post_json);
        ParseError (carrying the cost, the call was billed) when the content is not JSON."""
        request = {"model": self.model, "response_format": {"type": "json_object"},
                   "messages": [{"role": "system", "content": system},
                                {"role": "user", "content": user}]}
        auth = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        _, body = post_json(self.base_url.rstrip("/") + "/chat/completions", request,
                            {**auth, **(headers or {})}, self.timeout)
        if not isinstance(body, dict):
            raise ParseError(f"provider answered a body that is not JSON: {str(body)[:120]!r}")
        usage = body.get("usage") or {}
        cost = self._cost(body, usage)
        try:
            text = body["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise ParseError("provider answer has no choices[0].message.content", cost=cost) from None
        try:
            content = json.loads(text)
        except (TypeError, ValueError):
            raise ParseError(f"model content is not JSON: {str(text)[:120]!r}", cost=cost) from None
        return Completion(content, cost, int(usage.get("prompt_tokens") or 0),
                          int(usage.get("completion_tokens") or 0))

    def _cost(self, body: dict, usage: dict) -> float:
        for value in (usage.get("cost"), body.get("cost")):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        return (float(usage.get("prompt_tokens") or 0) * self.price_prompt_per_1k
                + float(usage.get("completion_tokens") or 0) * self.price_completion_per_1k) / 1000
