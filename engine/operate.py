"""`ninelives engine` for an operator: the queries (status, stuck, failures, jobs, costs,
alerts) as tables or JSON, the actions on one job (cancel, requeue, resolve), and rerunning a
step on its memoized input."""
from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import shutil
from typing import Any

from .config import ConfigError, EngineConfig
from .hooks import SystemClock
from .joblist import footer, listing, shell_word, states_named
from .retry import SchemaError
from .states import get_pipeline
from .steps import SCHEMAS, StepContext, check_schema, make_runner
from .store import OperatorError, Store, open_store
from .worker import store_options


def open_for(config: EngineConfig, read_only: bool = False) -> Store:
    """The store `config` names, opened as a worker opens it (its settings for that store)."""
    return open_store(config.db, read_only=read_only, **store_options(config, config.db))


OPERATOR = f"operator:{os.environ.get('USER', 'unknown')}"


#: The narrowest a table's last column is cut to, however narrow the terminal.
MIN_LAST_COLUMN = 24


def shorten(text: str, width: int) -> str:
    """`text` on one line in at most `width` characters: cut at a word boundary, with an
    ellipsis, when it is longer."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    cut = text[:width - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > width // 2 else cut).rstrip() + "…"


def print_rows(rows: list[dict], as_json: bool, width: int | None = None) -> None:
    """Print `rows` as JSON (every value whole), or as a table whose last column (an error,
    as a rule) is cut at a word boundary to fit `width` (default: the terminal's)."""
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return
    if not rows:
        print("(none)")
        return
    cols = list(rows[0])
    width = width or shutil.get_terminal_size().columns
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols[:-1]}
    room = max(MIN_LAST_COLUMN, width - sum(widths.values()) - 2 * len(widths))
    table = [[str(r[c]) for c in cols[:-1]] + [shorten(str(r[cols[-1]]), room)] for r in rows]
    widths[cols[-1]] = max(len(cols[-1]), *(len(cells[-1]) for cells in table))
    print("  ".join(c.ljust(widths[c]) for c in cols).rstrip())
    for cells in table:
        print("  ".join(cell.ljust(widths[c]) for c, cell in zip(cols, cells)).rstrip())


def cmd_query(args: argparse.Namespace, config: EngineConfig) -> int:
    """status, stuck, failures, jobs, costs and alerts: read-only; alerts exits 1 if it found
    any."""
    pipeline = get_pipeline(config.pipeline)
    states = states_named(pipeline, args.state) if args.command == "jobs" else frozenset()
    store = open_for(config, read_only=True)
    now = SystemClock().now()
    if args.command == "status":
        jobs, outbox = store.status(now), store.outbox_status(now)
        if args.json:
            print(json.dumps({"jobs": jobs, "outbox": outbox}, indent=2))
        else:
            print_rows(jobs, False)
            print("\noutbox")
            print_rows(outbox, False)
    elif args.command == "stuck":
        print_rows(store.stuck(now), args.json)
    elif args.command == "failures":
        print_rows(store.failures(pipeline.parked_states), args.json)
    elif args.command == "jobs":
        answer = listing(store, pipeline, states, now, args.limit)
        if args.json:
            print(json.dumps(answer, indent=2, default=str))
        else:
            print_rows([{**job, "id": shell_word(job["id"])} for job in answer["jobs"]], False)
            print("\n".join(footer(answer, args.limit)))
    elif args.command == "costs":
        print_rows(store.costs(now, args.window), args.json)
    else:
        if not (math.isfinite(args.unsent_after) and args.unsent_after > 0):
            raise ConfigError(f"--unsent-after must be a number of seconds > 0, "
                              f"got {args.unsent_after}")
        alerts = store.alerts(now, pipeline.terminal, pipeline.parked_states,
                              unsent_after=args.unsent_after)
        print(json.dumps(alerts, indent=2, default=str))
        return 1 if (alerts["parked"] or alerts["dead_letters"] or alerts["stuck"]
                     or alerts["unsent"]) else 0
    return 0


def cmd_action(args: argparse.Namespace, config: EngineConfig) -> int:
    store = open_for(config)
    now = SystemClock().now()
    if args.command == "cancel":
        print(f"job {args.job}: {store.cancel(args.job, OPERATOR, now)} -> cancelled")
    elif args.command == "requeue":
        print(f"job {args.job}: requeued to {store.requeue(args.job, OPERATOR, now)}")
    else:
        output = None
        if args.approve:
            output = {"ok": True, "reason": f"approved by {OPERATOR}"}
        elif args.output is not None:
            try:
                output = json.loads(args.output)
            except ValueError as exc:
                raise ConfigError(f"--output is not JSON: {exc}") from None
        if output is not None:
            check_resolution(store, args.job, output)
        print(f"job {args.job}: resolved to {store.resolve(args.job, OPERATOR, now, output)}")
    return 0


def check_resolution(store: Store, job_id: str, output: Any) -> None:
    """Refuse an operator's output that the parked step's schema would not accept: a memo
    the pipeline cannot use would kill every worker that picks the job up."""
    job = store.job(job_id)
    if job is None:
        raise OperatorError(f"no job {job_id!r}")
    pipeline = get_pipeline(job["pipeline"])
    for step in pipeline.steps:
        if job["state"] in (step.parked, step.alternate) and step.name in SCHEMAS:
            try:
                check_schema(step.name, output)
            except SchemaError as exc:
                raise ConfigError(f"--output does not fit step {step.name!r}: {exc}") from None


def cmd_rerun_step(args: argparse.Namespace, config: EngineConfig) -> int:
    """Rerun one step with its exact memoized input against current code; change nothing."""
    store = open_for(config, read_only=True)
    job = store.job(args.job)
    if job is None:
        raise OperatorError(f"no job {args.job!r}")
    pipeline = get_pipeline(job["pipeline"])
    step = pipeline.step_named(args.step)
    index = pipeline.steps.index(step)
    if index == 0:
        data = json.loads(job["payload"])
    else:
        prev = store.memo(args.job, pipeline.steps[index - 1].name)
        if prev is None:
            raise OperatorError(f"job {args.job!r} has no memo for step "
                                f"{pipeline.steps[index - 1].name!r}: nothing to rerun from")
        data = json.loads(prev)
    ctx = StepContext(args.job, step.name, OPERATOR, 0,
                      lambda name: json.loads(store.memo(args.job, name)))
    result = make_runner(config).call(step.name, data, ctx)
    new = json.dumps(result.output, indent=2, sort_keys=True).splitlines()
    stored = store.memo(args.job, step.name)
    old = json.dumps(json.loads(stored), indent=2, sort_keys=True).splitlines() if stored else []
    diff = list(difflib.unified_diff(old, new, "memo", "rerun", lineterm=""))
    print("\n".join(diff) if diff else "no difference from the memo")
    if result.cost:
        print(f"(this rerun was billed {result.cost}; nothing was written)")
    return 0
