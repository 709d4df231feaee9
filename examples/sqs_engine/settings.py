"""The SQS engine's settings: one dataclass, read from a table or flags, refused when unsafe."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

#: settings that must never appear on a command line.
SECRETS = frozenset({"provider_key"})
KEY_VARIABLE = "SQS_PROVIDER_KEY"


@dataclass(frozen=True)
class Settings:
    """`visibility` is the lease (seconds a received task stays invisible to other workers);
    while a step's call runs, a heartbeat extends it every `heartbeat_interval` (default a
    third of it). `max_receives` bounds the receives of one task, whatever ended the ones
    before (a failure or a crash): SQS's maxReceiveCount. After failed attempt i the task
    becomes visible again after a wait uniform in [0, min(backoff_cap, backoff_base * 2 **
    (i - 1))] (full jitter), never shorter than a Retry-After."""

    visibility: float = 10.0
    heartbeat: bool = True
    heartbeat_interval: float = 0.0        # 0: visibility / 3
    call_timeout: float = 5.0
    poll: float = 0.05
    max_receives: int = 8
    backoff_base: float = 0.05
    backoff_cap: float = 2.0
    send_timeout: float = 5.0
    outbox_visibility: float = 10.0
    outbox_max_receives: int = 6
    model: str = "sqs-model"
    provider_key: str = ""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "str":
                if not isinstance(value, str):
                    raise ValueError(f"sqs setting {f.name} must be a string, got {value!r}")
                continue
            if f.type == "bool":
                if not isinstance(value, bool):
                    raise ValueError(f"sqs setting {f.name} must be true or false, got {value!r}")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                    f.type == "int" and not isinstance(value, int)):
                raise ValueError(f"sqs setting {f.name} must be a"
                                 f"{'n integer' if f.type == 'int' else ' number'}, got {value!r}")
            if not math.isfinite(value) or value < 0 or (value == 0 and f.name != "heartbeat_interval"):
                raise ValueError(f"sqs setting {f.name} must be a finite number above 0, "
                                 f"got {value!r}")
        if not self.heartbeat and self.call_timeout >= self.visibility:
            raise ValueError(f"sqs settings call_timeout ({self.call_timeout}) must be shorter "
                             f"than visibility ({self.visibility}) without a heartbeat")
        if self.send_timeout >= self.outbox_visibility:
            raise ValueError(f"sqs settings send_timeout ({self.send_timeout}) must be shorter "
                             f"than outbox_visibility ({self.outbox_visibility})")

    @property
    def beat_every(self) -> float:
        return self.heartbeat_interval or self.visibility / 3.0

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> "Settings":
        """Settings from a table of name -> value; ValueError names an unknown or bad field."""
        known = {f.name: f for f in fields(cls)}
        for name in table:
            if name not in known:
                raise ValueError(f"unknown sqs setting {name!r} (known: {', '.join(known)})")
        values = {k: float(v) if known[k].type == "float" and isinstance(v, int)
                  and not isinstance(v, bool) else v for k, v in table.items()}
        return cls(**values)

    def backoff_bound(self, attempt: int) -> float:
        """The highest wait after failed attempt `attempt` (1-based)."""
        return min(self.backoff_cap, self.backoff_base * 2 ** (attempt - 1))


def flag_names() -> list[tuple[str, str]]:
    """(setting, type) of every setting that may be a flag (secrets come from the environment)."""
    return [(f.name, f.type) for f in fields(Settings) if f.name not in SECRETS]
