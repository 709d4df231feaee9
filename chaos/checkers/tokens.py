"""How checkers compare fencing tokens, under the engine's `token_order` (chaos.contract).

A token identifies one holding (a claim of a job or an outbox row) wherever the engine has
one: equal tokens are the same holding. "ordered" tokens say more: a newer claim carries a
greater one, so a write under a smaller token than the thing's last is a zombie's. "opaque"
tokens (a queue's random receipt handle) say nothing by their values: which of two holdings
is newer is the order in which the claims that carried them committed, the history's order.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Hashable

from chaos.history import Event

ORDERED, OPAQUE = "ordered", "opaque"


def token_order(snapshot: dict[str, Any]) -> str:
    """The run's engine's token order; "ordered" for a snapshot whose settings predate it."""
    return (snapshot.get("settings") or {}).get("token_order") or ORDERED


class TokenMarks:
    """Per thing (a job, an outbox row): the token of its newest holding, and whether a
    write's token is an older holding's (a token that went back)."""

    def __init__(self, order: str) -> None:
        self.order = order
        self.last: dict[Hashable, Any] = {}
        # with opaque tokens, the tokens of the thing's holdings older than its last one
        self.older: dict[Hashable, set] = defaultdict(set)

    def took(self, thing: Hashable, token: Any) -> None:
        """A lease-taking write (a claim) under `token`, in commit order."""
        if token is None:
            return
        if self.order == ORDERED:
            self.last[thing] = max(self.last.get(thing, token), token)
        else:
            self._newest(thing, token)

    def kept(self, thing: Hashable, token: Any) -> None:
        """A write by the thing's owner under `token` (judged not to have gone back)."""
        if token is None:
            return
        if self.order == ORDERED:
            self.last[thing] = token
        else:
            self._newest(thing, token)

    def went_back(self, thing: Hashable, token: Any) -> bool:
        """Whether a write under `token` is under an older holding than the thing's newest:
        a smaller token (ordered), or the token of a holding whose claim committed before
        the newest one's (opaque; a token never seen on the thing proves nothing)."""
        last = self.last.get(thing)
        if token is None or last is None:
            return False
        if self.order == ORDERED:
            return token < last
        return token != last and token in self.older[thing]

    def _newest(self, thing: Hashable, token: Any) -> None:
        last = self.last.get(thing)
        if last is not None and last != token:
            self.older[thing].add(last)
        self.older[thing].discard(token)
        self.last[thing] = token


def fenced_out(token: Any, claim: Event, claims: list[Event], order: str) -> bool | None:
    """Whether the holding under `token` is older than `claim`, whose taking the lease fenced
    it out. `claims`: the lease-taking writes of claim's job in commit order (`claim` among
    them). Ordered tokens: `token` < claim's. Opaque: the tokens differ and a claim under
    `token` committed before `claim`; None when no claim under `token` is known (it cannot
    be told). False when either token is missing: nothing to compare."""
    mine = claim.get("token")
    if token is None or mine is None:
        return False
    if order == ORDERED:
        return token < mine
    if token == mine:
        return False
    position = next((i for i, c in enumerate(claims) if c is claim), None)
    under = [i for i, c in enumerate(claims) if c.get("token") == token]
    if position is None or not under:
        return None
    return min(under) < position
