"""The toy engine's settings: one dataclass, read from a table or flags, refused when unsafe."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

#: settings that must never appear on a command line.
SECRETS = frozenset({"provider_key"})
KEY_VARIABLE = "TOY_PROVIDER_KEY"


@dataclass(frozen=True)
class Settings:
    """lease and call_timeout in seconds: with no heartbeat, a call must end inside its lease.
    Backoff after failed attempt i (1-based) is uniform in [0, min(backoff_cap, backoff_base *
    2 ** (i - 1))] (full jitter), never shorter than a Retry-After."""

    lease: float = 10.0
    call_timeout: float = 5.0
    poll: float = 0.05
    max_attempts: int = 4
    max_claims: int = 8
    backoff_base: float = 0.05
    backoff_cap: float = 2.0
    send_timeout: float = 5.0
    outbox_lease: float = 10.0
    outbox_max_attempts: int = 6
    model: str = "toy-model"
    provider_key: str = ""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "str":
                if not isinstance(value, str):
                    raise ValueError(f"toy setting {f.name} must be a string, got {value!r}")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                    f.type == "int" and not isinstance(value, int)):
                raise ValueError(f"toy setting {f.name} must be a{'n integer' if f.type == 'int' else ' number'}, got {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"toy setting {f.name} must be a finite number above 0, "
                                 f"got {value!r}")
        if self.call_timeout >= self.lease:
            raise ValueError(f"toy settings call_timeout ({self.call_timeout}) must be shorter "
                             f"than lease ({self.lease}): there is no heartbeat")
        if self.send_timeout >= self.outbox_lease:
            raise ValueError(f"toy settings send_timeout ({self.send_timeout}) must be shorter "
                             f"than outbox_lease ({self.outbox_lease})")
        if self.max_claims <= self.max_attempts:
            raise ValueError(f"toy settings max_claims ({self.max_claims}) must exceed "
                             f"max_attempts ({self.max_attempts}): every retry is a claim")

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> "Settings":
        """Settings from a table of name -> value; ValueError names an unknown or bad field."""
        known = {f.name: f for f in fields(cls)}
        for name in table:
            if name not in known:
                raise ValueError(f"unknown toy setting {name!r} (known: {', '.join(known)})")
        values = {k: float(v) if known[k].type == "float" and isinstance(v, int)
                  and not isinstance(v, bool) else v for k, v in table.items()}
        return cls(**values)

    def backoff_bound(self, attempt: int) -> float:
        """The highest wait after failed attempt `attempt` (1-based)."""
        return min(self.backoff_cap, self.backoff_base * 2 ** (attempt - 1))


def flag_names() -> list[tuple[str, str]]:
    """(setting, type) of every setting that may be a flag (secrets come from the environment)."""
    return [(f.name, f.type) for f in fields(Settings) if f.name not in SECRETS]
