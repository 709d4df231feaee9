"""`ninelives engine ...`: run workers and senders, submit jobs, and operate the database."""
from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import logging
import math
import os
import signal
import sys
import threading
from collections import Counter
from typing import Any, Callable, Iterable, Iterator, Sequence

from .config import DEFAULT_WORDS, FIELDS, MEANING, ConfigError, EngineConfig, load_config
from .hooks import SkewedClock, SystemClock, arm_from_env
from .joblist import GROUPS
from .operate import cmd_action, cmd_query, cmd_rerun_step, open_for
from .outbox import Sender
from .retry import PoisonError, StepError
from .states import PipelineError, get_pipeline
from .steps import PAYLOAD_SHAPE, check_payload
from .store import DatabaseError, OperatorError, SubmissionConflict, shown_target
from .slots import Slots
from .worker import Worker, new_worker_id


#: The settings of a database, which every command opens.
STORE_SETTINGS = ("db", "pipeline", "synchronous", "busy_timeout", "reconnect_window")
#: The settings of the provider's client, for the commands that call the model.
CLIENT_SETTINGS = ("steps", "call_timeout", "provider_url", "provider_key", "model",
                   "price_prompt_per_1k", "price_completion_per_1k")
#: The settings each command uses, shown in its help. Every command accepts every setting
#: (a shared config file or environment sets them all), but shows only its own.
COMMAND_SETTINGS = {
    "worker": STORE_SETTINGS + CLIENT_SETTINGS + (
        "lease", "heartbeat", "heartbeat_interval", "max_attempts", "max_claims",
        "backoff_base", "backoff_cap", "keep_job", "slots", "group_commit", "poll_interval",
        "seed", "unsafe_long_calls"),
    "send": STORE_SETTINGS + ("receiver_url", "send_timeout", "outbox_lease",
                              "outbox_max_attempts", "backoff_base", "backoff_cap",
                              "poll_interval", "seed"),
    "submit": STORE_SETTINGS + ("steps", "max_payload_bytes"),
    "rerun-step": STORE_SETTINGS + CLIENT_SETTINGS,
}


def add_settings(parser: argparse.ArgumentParser, command: str) -> None:
    """One flag per engine setting (--lease, --call-timeout, ...), plus --config; the help
    lists only the settings `command` uses (the rest are accepted, and hidden)."""
    group = parser.add_argument_group("settings (flags override NINELIVES_* and --config)")
    group.add_argument("--config", help="TOML file of settings (top level or [engine])")
    shown = COMMAND_SETTINGS.get(command, STORE_SETTINGS)
    for name, field in FIELDS.items():
        default = DEFAULT_WORDS.get(name, field.default)
        if isinstance(default, bool):
            default = "on" if default else "off"
        text = f"{MEANING[name]} (default {default})" if name in shown else argparse.SUPPRESS
        group.add_argument(f"--{name.replace('_', '-')}", dest=f"set_{name}",
                           metavar="on|off" if field.type == "bool" else field.type.upper(),
                           help=text)


def settings(args: argparse.Namespace) -> EngineConfig:
    """The command's EngineConfig: --config, then NINELIVES_*, then the flags (text, parsed)."""
    flags = {name: getattr(args, f"set_{name}") for name in FIELDS}
    return load_config(args.config, flags=flags)


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies, so no worker is orphaned."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the parent died before the request took effect
        os._exit(1)


def stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def cmd_worker(args: argparse.Namespace, config: EngineConfig) -> int:
    clock = SkewedClock(args.clock_skew) if args.clock_skew else SystemClock()
    worker = Slots(config, lambda: open_for(config),
                   lambda store, **kw: Worker(store, config, clock=clock, **kw),
                   clock=clock, worker_id=new_worker_id())
    stop = stop_on_signals()
    slots = f" with {config.slots} slots" if config.slots > 1 else ""
    print(f"worker {worker.id}{slots} on {shown_target(config.db)}", file=sys.stderr,
          flush=True)
    if config.calls_may_outlive_lease:
        print(f"warning: unsafe_long_calls is on: calls may outlive the {config.lease} s lease "
              "with heartbeat off; another worker may pay for the same step", file=sys.stderr)
    stats = worker.run(stop, max_jobs=args.max_jobs, exit_when_idle=args.exit_when_idle)
    print(f"worker {worker.id} done: {stats}", file=sys.stderr)
    return 0


def cmd_send(args: argparse.Namespace, config: EngineConfig) -> int:
    store = open_for(config)
    sender = Sender(store, config)
    stop = stop_on_signals()
    idle = (lambda: store.active_jobs(config.pipeline) == 0) if args.exit_when_idle else None
    sender.run(stop, exit_when_idle=args.exit_when_idle, idle_when=idle)
    print(f"sender {sender.id} done: sent {sender.sent}, failed {sender.failed}", file=sys.stderr)
    return 0


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # json.loads alone would take NaN and Infinity


def parse_json(text: str) -> Any:
    """Strict JSON: only what canonical_json can store (no NaN, no Infinity)."""
    return json.loads(text, parse_constant=_not_json)


def payload_check(config: EngineConfig) -> Callable[[Any], Any] | None:
    """The payload shape submit enforces: the document pipeline's, when the built-in steps
    run it (a pipeline or steps of the user's own may take any JSON)."""
    if config.pipeline == "document" and config.steps in ("document", "instant"):
        return check_payload
    return None


def file_jobs(path: str, limit: int, check: Callable[[Any], Any] | None
              ) -> Iterator[tuple[int, str, Any]]:
    """Yield (line number, id, payload) per non-blank line of the JSON-lines file `path`.

    Reads one line at a time and never more than `limit` + 2 bytes of it, so a line longer
    than `limit` bytes is refused before it costs memory. `check` (if any) vets each payload.
    Raises ConfigError naming the file and the line.
    """
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise ConfigError(f"--file {path}: {exc.strerror or exc}") from None
    with fh:
        for n in itertools.count(1):
            raw = fh.readline(limit + 2)  # bounded: a 1 GB line is never read whole
            if not raw:
                return
            body = raw[:-1] if raw.endswith(b"\n") else raw
            if len(body) > limit:
                raise ConfigError(f"{path}:{n}: the line is longer than max_payload_bytes "
                                  f"({limit} bytes; raise the setting to accept it)")
            try:
                line = body.decode("utf-8")
                if not line.strip():
                    continue
                item = parse_json(line)
                job_id, payload = str(item["id"]), item["payload"]
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(f"{path}:{n}: each line must be a UTF-8 JSON object "
                                  f"with 'id' and 'payload' ({type(exc).__name__}: {exc})") from None
            _vet(check, payload, f"{path}:{n}: job {job_id!r}")
            yield n, job_id, payload


def flag_job(args: argparse.Namespace, limit: int, check: Callable[[Any], Any] | None
             ) -> tuple[str, Any]:
    """The one job of --id and --payload. Raises ConfigError naming the flag."""
    if not (args.id and args.payload is not None):
        raise ConfigError("submit needs --id and --payload, or --file")
    if len(args.payload.encode("utf-8", "surrogateescape")) > limit:
        raise ConfigError(f"--payload is longer than max_payload_bytes ({limit} bytes)")
    try:
        payload = parse_json(args.payload)
    except ValueError as exc:
        raise ConfigError(f"--payload is not JSON: {exc}") from None
    _vet(check, payload, "--payload")
    return args.id, payload


def _vet(check: Callable[[Any], Any] | None, payload: Any, where: str) -> None:
    if check is None:
        return
    try:
        check(payload)
    except PoisonError as exc:  # refused now rather than parked at its first step
        raise ConfigError(f"{where}: {exc} (the document pipeline takes {PAYLOAD_SHAPE})"
                          ) from None


def cmd_submit(args: argparse.Namespace, config: EngineConfig) -> int:
    """Submit --id/--payload, or every line of --file, each job in its own transaction.

    A file is read twice, one line at a time: first every line is checked (a bad one submits
    nothing), then each job is submitted. A failure on the way (a full disk, a locked
    database) stops there and says how many jobs are committed and the line to resume from;
    submitting the whole file again is safe: the same id with the same payload changes nothing.
    """
    pipeline = get_pipeline(config.pipeline)
    limit, check = config.max_payload_bytes, payload_check(config)
    jobs: Iterable[tuple[int | None, str, Any]]
    if args.file:
        try:
            total = sum(1 for _ in file_jobs(args.file, limit, check))
        except ConfigError as exc:
            raise ConfigError(f"{exc}; nothing was submitted") from None
        jobs = file_jobs(args.file, limit, check)
    else:
        total, jobs = 1, [(None, *flag_job(args, limit, check))]
    store = open_for(config)
    counts = Counter({"new": 0, "already present": 0, "rejected": 0})
    for line, job_id, payload in jobs:
        try:
            created = store.submit(job_id, pipeline, payload, SystemClock().now())
            counts["new" if created else "already present"] += 1
        except SubmissionConflict as exc:
            counts["rejected"] += 1
            print(f"error: {exc}", file=sys.stderr)
        except DatabaseError as exc:
            if line is None:
                raise
            print(f"{submitted(counts)}, {total - counts.total()} not submitted")
            raise DatabaseError(stopped(exc, args.file, line, counts, total)) from None
    print(submitted(counts))
    return 2 if counts["rejected"] else 0  # an id reused with another payload is bad input


def submitted(counts: Counter) -> str:
    """The summary line: `submitted N new, N already present, N rejected`."""
    return f"submitted {', '.join(f'{n} {what}' for what, n in counts.items())}"


def stopped(exc: Exception, path: str, line: int, counts: Counter, total: int) -> str:
    """What a file's submit cut short by `exc` at `line` says: what is committed, how to go on."""
    committed = counts["new"] + counts["already present"]
    return (f"{exc}. submit stopped at {path}:{line}: {committed} of the file's {total} jobs "
            f"are committed ({counts['new']} new, {counts['already present']} already "
            f"present), all from lines before {line}; the {total - counts.total()} from line "
            f"{line} on are not. Once the cause is fixed, submit the same file again (ids "
            f"already committed are skipped as already present) or resume from line {line} "
            f"(tail -n +{line} {path})")


SUBMIT_HELP = (
    "Submit one job (--id, --payload) or a JSON-lines file of {\"id\", \"payload\"} "
    "(--file), idempotent on the id: the same id with the same payload changes nothing, with "
    f"another it is rejected. The built-in document pipeline takes {PAYLOAD_SHAPE} (other "
    "keys go to the model with them), e.g. {\"title\": \"Invoice 7\", \"body\": \"...\"}; "
    "any other payload is refused here, not parked later. A payload or file line longer than "
    f"max_payload_bytes (default {EngineConfig.max_payload_bytes // 2 ** 20} MiB) is refused. "
    "A file is checked whole before anything is submitted; if the database fails midway, "
    "submit says how many jobs are committed and the line to resume from.")


WITH_PARENT = "die when the parent process dies (how the harness starts its processes)"


def finite(text: str) -> float:
    """A flag's finite number (argparse names the flag when this raises)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def positive(text: str) -> float:
    """A flag's finite number above 0."""
    value = finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def count(text: str) -> int:
    """A flag's whole number, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ninelives engine", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("worker", help="claim jobs and run their steps")
    p.add_argument("--max-jobs", type=count, metavar="N",
                   help="exit after this many jobs (default: no limit; with slots, in all, "
                   "each slot finishing the job it holds)")
    p.add_argument("--exit-when-idle", action="store_true",
                   help="exit once no job waits for a worker")
    p.add_argument("--exit-with-parent", action="store_true", help=WITH_PARENT)
    p.add_argument("--clock-skew", type=finite, default=0.0, metavar="SECONDS",
                   help="seconds added to the clock (default 0)")
    p = sub.add_parser("send", help="deliver outbox rows to the receiver")
    p.add_argument("--exit-when-idle", action="store_true",
                   help="exit once no outbox row is pending and no job is active")
    p.add_argument("--exit-with-parent", action="store_true", help=WITH_PARENT)
    p = sub.add_parser("submit", help="submit jobs (idempotent on the id)",
                       description=SUBMIT_HELP)
    p.add_argument("--id", help="the job's id (with --payload)")
    p.add_argument("--payload", help="the job's JSON payload")
    p.add_argument("--file", help="JSON lines of {id, payload}")
    for name, text in (("status", "jobs per state and their age"),
                       ("stuck", "jobs whose lease expired mid-step"),
                       ("failures", "parked jobs grouped by error"),
                       ("jobs", "jobs in some states by id, to requeue, resolve or cancel"),
                       ("costs", "cost per step, committed and wasted"),
                       ("alerts", "oldest unfinished job, parked rows, dead letters")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        if name == "jobs":
            p.add_argument("--state", default="parked", metavar="STATE[,STATE...]",
                           help="a state of the pipeline, or a group: " + "; ".join(
                               f"{g}: {what}" for g, what in GROUPS.items())
                           + " (default parked)")
            p.add_argument("--limit", type=count, default=50, metavar="N",
                           help="list at most N jobs, the oldest first (default 50); the "
                                "count of the rest is printed under them")
        if name == "costs":
            p.add_argument("--window", type=positive, default=86400.0, metavar="SECONDS",
                           help="seconds back (default 86400)")
        if name == "alerts":
            p.add_argument("--unsent-after", type=positive, default=300.0, metavar="SECONDS",
                           help="flag outbox rows still unsent this long after they were "
                                "written (default 300: longer than the default retries take)")
    for name, text in (("cancel", "cancel a ready or parked job"),
                       ("requeue", "send a parked job back to its step"),
                       ("resolve", "settle a parked step by hand")):
        p = sub.add_parser(name, help=text)
        p.add_argument("job", help="the job's id (as `jobs` shows it; after -- if it starts "
                                   "with -)")
        if name == "resolve":
            p.add_argument("--output", help="JSON to record as the step's result")
            p.add_argument("--approve", action="store_true",
                           help="document pipeline: record the verify step as approved")
    p = sub.add_parser("rerun-step", help="rerun one step on its memoized input; print the diff")
    p.add_argument("job", help="the job's id")
    p.add_argument("step", help="the step's name, e.g. extract")
    for command, action in sub.choices.items():
        add_settings(action, command)
    return parser


COMMANDS = {"worker": cmd_worker, "send": cmd_send, "submit": cmd_submit,
            "cancel": cmd_action, "requeue": cmd_action, "resolve": cmd_action,
            "rerun-step": cmd_rerun_step}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one engine command; returns the exit code (2 for bad input or an unusable database)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=os.environ.get("NINELIVES_LOG", "WARNING"),
                        format="%(asctime)s %(name)s %(message)s")
    if getattr(args, "exit_with_parent", False):
        die_with_parent()
    try:
        arm_from_env()
        config = settings(args)
        return COMMANDS.get(args.command, cmd_query)(args, config)
    except (ConfigError, DatabaseError, OperatorError, PipelineError, StepError,
            ValueError, KeyError, OSError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
