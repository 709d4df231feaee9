"""The retry decision: the exception type carries it, and backoff is exponential with full jitter."""
from __future__ import annotations

import random
from dataclasses import dataclass


class StepError(Exception):
    """A step failed. Subclasses say whether trying again can help."""

    retryable = False

    def __init__(self, message: str, *, cost: float | None = None) -> None:
        super().__init__(message)
        self.cost = cost  # what the failed call was billed, when known


class RetryableError(StepError):
    """Trying again later may succeed: timeouts, connection errors, 429, 5xx."""

    retryable = True

    def __init__(self, message: str, *, retry_after: float | None = None,
                 cost: float | None = None) -> None:
        super().__init__(message, cost=cost)
        self.retry_after = retry_after  # the server's Retry-After, in seconds


class CallTimeout(RetryableError):
    """The call outlived its timeout. The provider may have done (and billed) the work."""


class PoisonError(StepError):
    """Nothing about a retry would differ: 4xx other than 429, parse and schema errors."""


class ParseError(PoisonError):
    """The answer could not be parsed."""


class SchemaError(PoisonError):
    """The answer parsed but does not have the shape the step needs."""


def classify(exc: BaseException) -> bool:
    """True when `exc` is worth retrying. Unknown exceptions are treated as poison."""
    if isinstance(exc, StepError):
        return exc.retryable
    return isinstance(exc, (TimeoutError, ConnectionError))


def classify_status(status: int) -> bool:
    """True for HTTP statuses worth retrying: 429 and 5xx."""
    return status == 429 or 500 <= status <= 599


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter, bounded by `base` and `cap` (seconds).

    The n-th retry waits uniformly in [0, min(cap, base * 2**(n-1))], but never less than a
    server's Retry-After.
    """

    base: float = 0.5
    cap: float = 30.0

    def ceiling(self, attempt: int) -> float:
        """The upper bound of the wait before retry number `attempt` (1-based)."""
        return min(self.cap, self.base * 2.0 ** max(0, attempt - 1))

    def delay(self, attempt: int, rng: random.Random, retry_after: float | None = None) -> float:
        wait = rng.uniform(0.0, self.ceiling(attempt))
        if retry_after is not None:
            wait = max(wait, retry_after)
        return wait
