"""Engine settings: defaults, then a TOML file, then NINELIVES_* environment, then flags.

Every value is checked at start-up; a setting that would let a call outlive its lease
unnoticed is refused with an error naming the settings involved.
"""
from __future__ import annotations

import dataclasses
import math
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
    slots: int = 1                     # jobs one worker process runs at once (a thread each)
    group_commit: bool = True          # slots' finishing writes ready together: one commit
    synchronous: str = "FULL"
    busy_timeout: float = 5.0
    # A PostgreSQL server's crash and restart (recovery included) takes seconds; a worker
    # that gives up sooner dies of an outage it could have ridden out.
    reconnect_window: float = 30.0
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
        for f in fields(self):  # nan passes every comparison below, inf makes a lease endless
            if f.type == "float" and not math.isfinite(getattr(self, f.name)):
                raise ConfigError(f"setting {f.name!r} must be a finite number, "
                                  f"got {getattr(self, f.name)}")
        for name in ("heartbeat_interval", "price_prompt_per_1k", "price_completion_per_1k",
                     "reconnect_window"):
            if getattr(self, name) < 0:
                raise ConfigError(f"setting {name!r} must be >= 0, got {getattr(self, name)}")
        for name in ("lease", "call_timeout", "backoff_base", "backoff_cap", "busy_timeout",
                     "poll_interval", "send_timeout", "outbox_lease"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"setting {name!r} must be > 0, got {getattr(self, name)}")
        if not 1 <= self.slots <= MAX_SLOTS:
            raise ConfigError(f"setting 'slots' must be from 1 to {MAX_SLOTS}, got {self.slots}")
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


#: The most job slots one worker process may run: each is a thread with its own connection.
MAX_SLOTS = 1024
FIELDS = {f.name: f for f in fields(EngineConfig)}
#: What each setting means, for the help of the flags.
MEANING = {
    "db": "the SQLite file, or a postgresql://user@host:port/dbname URL",
    "pipeline": "the pipeline: a built-in name or a TOML file",
    "steps": "step implementations: document, instant, or module:object",
    "lease": "seconds a claim lasts without a heartbeat",
    "heartbeat": "extend the lease during calls",
    "heartbeat_interval": "seconds between heartbeats",
    "call_timeout": "hard deadline of every provider call, in seconds",
    "max_attempts": "failed attempts per step before the job parks",
    "max_claims": "claims per step before the job parks (the crash-loop cap)",
    "backoff_base": "seconds: the first retry waits up to this (full jitter)",
    "backoff_cap": "seconds: no retry waits longer",
    "keep_job": "move on to the next step under the same lease",
    "slots": "jobs one worker process runs at once, each in a thread with its own "
             "connection and lease",
    "group_commit": "with slots: commit the finishing writes of slots that are ready "
                    "together in one transaction (SQLite)",
    "synchronous": "FULL (committed means durable) or NORMAL (faster)",
    "busy_timeout": "seconds a write waits for the database lock",
    "reconnect_window": "seconds to keep trying a PostgreSQL server that cannot be reached "
                        "(down, restarting, in recovery) before giving up; 0: one try",
    "poll_interval": "seconds an idle worker or sender sleeps between polls",
    "provider_url": "the OpenAI-compatible endpoint",
    "provider_key": "the provider's API key (better in NINELIVES_PROVIDER_KEY: flags show in ps)",
    "model": "the model to ask",
    "price_prompt_per_1k": "price per 1,000 prompt tokens, when an answer has no usage.cost",
    "price_completion_per_1k": "price per 1,000 completion tokens, likewise",
    "receiver_url": "where the outbox posts effects",
    "send_timeout": "hard deadline of every post to the receiver, in seconds",
    "outbox_lease": "seconds a sender holds an outbox row",
    "outbox_max_attempts": "posts of an outbox row before it is dead-lettered",
    "seed": "seed of the random source (jitter)",
    "unsafe_long_calls": "measurement only: allow calls to outlive the lease",
    "max_payload_bytes": "bytes: submit refuses a longer payload or file line",
}
#: Defaults whose stored value is a stand-in, as the help says them.
DEFAULT_WORDS = {"heartbeat_interval": "lease/3", "seed": "from the OS",
                 "provider_key": "none"}
ENV_PREFIX = "NINELIVES_"
#: A setting whose name says this holds a secret: no message shows its value.
SECRET = re.compile(r"key|token|secret|password", re.IGNORECASE)


#: What each kind of setting must be, as an error message says it.
KINDS = {"bool": "a boolean", "int": "an integer", "float": "a finite number", "str": "a string"}
#: The words a boolean setting may be written as in text (the environment, a flag).
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _coerce(name: str, value: Any, source: str | None, text: bool) -> Any:
    """`value` as setting `name` holds it. Text (an environment variable, a flag) is parsed;
    a typed value (a TOML file, a table given in code) must already be of the setting's
    kind: `lease = "2"` is a string there, not a number. A number must be finite. Raises
    ConfigError naming the setting and `source`."""
    kind = FIELDS[name].type
    try:
        if text and isinstance(value, str):
            return _parse(kind, value)
        return _typed(kind, value)
    except (TypeError, ValueError, OverflowError):
        words = (f" ({', '.join(w for pair in zip(TRUE_WORDS, FALSE_WORDS) for w in pair)})"
                 if kind == "bool" and text else
                 " (written without quotes)" if isinstance(value, str) and not text else "")
        where = f"{source}: " if source else ""
        shown = "a value not shown (a secret)" if SECRET.search(name) else repr(value)
        raise ConfigError(f"{where}setting {name!r} must be {KINDS[kind]}{words}, "
                          f"got {shown}") from None


def _parse(kind: str, text: str) -> Any:
    """A setting of `kind` from its text; raises ValueError if it is not one."""
    if kind == "bool":
        word = text.strip().lower()
        if word in TRUE_WORDS or word in FALSE_WORDS:
            return word in TRUE_WORDS
        raise ValueError(text)
    if kind == "int":
        return int(text.strip())
    if kind == "float":
        return _typed(kind, float(text))
    return text


def _typed(kind: str, value: Any) -> Any:
    """`value` if it is of `kind` (an int for a float too; never a bool for a number, and
    never nan or infinity: a lease of nan compares false with everything and passes every
    check); raises TypeError otherwise."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "int" and number and isinstance(value, int):
        return value
    if kind == "float" and number and math.isfinite(value):
        return float(value)
    if kind == "str" and isinstance(value, str):
        return value
    raise TypeError(value)


def load_config(file: str | None = None, env: Mapping[str, str] | None = None,
                overrides: Mapping[str, Any] | None = None,
                flags: Mapping[str, Any] | None = None) -> EngineConfig:
    """Build a validated EngineConfig from a TOML file, the environment, typed overrides and
    command-line flags, each later source winning.

    The file may hold settings at top level or under an [engine] table; unknown keys are
    errors, and its values must have the setting's type. Environment variables are
    NINELIVES_<SETTING> (e.g. NINELIVES_LEASE), parsed from text. `overrides` are typed
    values (a scenario's table, a caller's settings) and must have the setting's type;
    `flags` are text from a command line and are parsed. An override or flag whose value is
    None is ignored. Raises ConfigError naming the setting and where it came from.
    """
    values: dict[str, Any] = {}
    if file:
        values.update(_from_file(file))
    environ = os.environ if env is None else env
    for name in FIELDS:
        key = ENV_PREFIX + name.upper()
        if key in environ:
            values[name] = _coerce(name, environ[key], f"environment variable {key}", True)
    for given, text in ((overrides, False), (flags, True)):
        for name, value in (given or {}).items():
            if value is None:
                continue
            if name not in FIELDS:
                raise ConfigError(f"unknown setting {name!r}")
            source = f"flag --{name.replace('_', '-')}" if text else None
            values[name] = _coerce(name, value, source, text)
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
        out[name] = _coerce(name, value, f"config file {path}", False)
    return out
