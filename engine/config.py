"""Engine settings: defaults, then a TOML file, then NINELIVES_* environment, then flags.

Every value is checked at start-up; a setting that would let a call outlive its lease
unnoticed is refused with an error naming the settings involved.
"""
from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, fields
from typing import Any, Mapping


class ConfigError(ValueError):
    """A setting is missing, malformed or unsafe; the message names it and where it came from."""


@dataclass(frozen=True)
class EngineConfig:
    """Everything a worker or sender needs. Times are in seconds."""

    db: str = "ninelives.db"
    pipeline: str = "document"
    steps: str = "document"            # step implementations: "document", "instant", or module:object
    lease: float = 30.0
    heartbeat: bool = True
    heartbeat_interval: float = 0.0    # 0 = lease / 3
    call_timeout: float = 20.0
    # 25 attempts, waits capped at 60 s: rides out a provider outage of 5 minutes (none of
    # the jobs parked in bench/outage.py; 5 attempts up to 30 s parked all within 7.5 s).
    max_attempts: int = 25
    max_claims: int = 30               # must exceed max_attempts (see validate)
    backoff_base: float = 0.5
    backoff_cap: float = 60.0
    keep_job: bool = True              # move on to the next step under the same lease
    synchronous: str = "FULL"
    busy_timeout: float = 5.0
    poll_interval: float = 0.05
    provider_url: str = "http://127.0.0.1:8080/v1"
    provider_key: str = ""
    model: str = "fake-model"
    price_prompt_per_1k: float = 0.0  # used only when a response carries no cost
    price_completion_per_1k: float = 0.0
    receiver_url: str = "http://127.0.0.1:8081/v1/effects"
    send_timeout: float = 10.0
    outbox_lease: float = 30.0
    outbox_max_attempts: int = 8
    seed: int = -1                     # -1 = seed the random source from the OS
    max_payload_bytes: int = 4 * 1024 * 1024  # submit refuses a longer --payload or --file line
    unsafe_long_calls: bool = False    # measurement only: allow calls to outlive the lease

    @property
    def calls_may_outlive_lease(self) -> bool:
        return not self.heartbeat and self.call_timeout >= self.lease

    @property
    def beat_every(self) -> float:
        return self.heartbeat_interval or self.lease / 3.0

    def validate(self) -> "EngineConfig":
        """Return self if every setting is usable, else raise ConfigError naming it."""
        for name in ("lease", "call_timeout", "backoff_base", "backoff_cap", "busy_timeout",
                     "poll_interval", "send_timeout", "outbox_lease"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"setting {name!r} must be > 0, got {getattr(self, name)}")
        for name in ("max_attempts", "max_claims", "outbox_max_attempts", "max_payload_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"setting {name!r} must be >= 1, got {getattr(self, name)}")
        if self.synchronous.upper() not in ("FULL", "NORMAL"):
            raise ConfigError(f"setting 'synchronous' must be FULL or NORMAL, got {self.synchronous!r}")
        if not self.heartbeat and self.call_timeout >= self.lease and not self.unsafe_long_calls:
            raise ConfigError(
                f"unsafe settings: call_timeout ({self.call_timeout} s) is not shorter than "
                f"lease ({self.lease} s) and heartbeat is off, so a call can outlive its lease "
                "and another worker would pay for the same step. Lower 'call_timeout', raise "
                "'lease', or turn 'heartbeat' on (or, to measure the damage, set "
                "'unsafe_long_calls').")
        if self.heartbeat and self.beat_every >= self.lease:
            raise ConfigError(f"setting 'heartbeat_interval' ({self.beat_every} s) must be "
                              f"shorter than 'lease' ({self.lease} s)")
        if self.send_timeout >= self.outbox_lease:
            raise ConfigError(
                f"unsafe settings: send_timeout ({self.send_timeout} s) is not shorter than "
                f"outbox_lease ({self.outbox_lease} s): two senders could send one row at once")
        if self.max_claims <= self.max_attempts:
            raise ConfigError(
                f"setting 'max_claims' ({self.max_claims}) must exceed 'max_attempts' "
                f"({self.max_attempts}): every attempt begins with a claim, so a lower "
                "crash-loop cap would park jobs that are only retrying")
        return self


FIELDS = {f.name: f for f in fields(EngineConfig)}
ENV_PREFIX = "NINELIVES_"
#: A setting whose name says this holds a secret: no message shows its value.
SECRET = re.compile(r"key|token|secret|password", re.IGNORECASE)


def _coerce(name: str, value: Any, source: str) -> Any:
    kind = FIELDS[name].type
    try:
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if kind == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(value)
            return int(value)
        if kind == "float":
            if isinstance(value, bool):
                raise ValueError(value)
            return float(value)
        if not isinstance(value, str):
            raise ValueError(value)
        return value
    except (TypeError, ValueError):
        shown = "a value not shown (a secret)" if SECRET.search(name) else repr(value)
        raise ConfigError(f"{source}: setting {name!r} must be a {kind}, got {shown}") from None


def load_config(file: str | None = None, env: Mapping[str, str] | None = None,
                overrides: Mapping[str, Any] | None = None) -> EngineConfig:
    """Build a validated EngineConfig from a TOML file, the environment and flag overrides.

    The file may hold settings at top level or under an [engine] table; unknown keys are
    errors. Environment variables are NINELIVES_<SETTING> (e.g. NINELIVES_LEASE). Flag
    overrides whose value is None are ignored. Raises ConfigError naming the setting.
    """
    values: dict[str, Any] = {}
    if file:
        values.update(_from_file(file))
    environ = os.environ if env is None else env
    for name in FIELDS:
        key = ENV_PREFIX + name.upper()
        if key in environ:
            values[name] = _coerce(name, environ[key], f"environment variable {key}")
    for name, value in (overrides or {}).items():
        if value is None:
            continue
        if name not in FIELDS:
            raise ConfigError(f"unknown setting {name!r}")
        values[name] = _coerce(name, value, f"flag --{name.replace('_', '-')}")
    return dataclasses.replace(EngineConfig(), **values).validate()


def _from_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    table = data.get("engine", data)
    if not isinstance(table, dict):
        raise ConfigError(f"config file {path}: [engine] must be a table")
    out = {}
    for name, value in table.items():
        if name not in FIELDS:
            raise ConfigError(f"config file {path}: unknown setting {name!r} "
                              f"(known: {', '.join(sorted(FIELDS))})")
        out[name] = _coerce(name, value, f"config file {path}")
    return out
