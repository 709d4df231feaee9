"""The history's reference page, docs/history.md, generated from the schema (`chaos.engines.schema`)
and the fields each checker declares it reads (`chaos.checkers.READS`):
`python -m chaos.docs.history_page --write docs/history.md`. A test fails when the page is stale."""
from __future__ import annotations

import argparse
import sys

from chaos.checkers import READS, load
from chaos.engines.schema import (DEFAULTED, ENGINE, EVIDENCE, KINDS, REQUIRED, SNAPSHOT, Field,
                                  OpType, opt, req)


#: Operations the harness records itself (documented here; an adapter never writes them).
HARNESS: tuple[OpType, ...] = (
    OpType("provider", "call", "one request to the fake model provider, t = t_start", (
        req("job", "str", "the job it was for"), req("step", "str", "the step"),
        req("worker", "str", "the worker id it came with", nullable=True),
        req("n", "int", "the n-th call of this job-step"),
        req("t_start", "time", "when it arrived"), req("t_end", "time", "when it ended"),
        req("status", "int", "the HTTP status sent", nullable=True),
        req("outcome", "str", "ok, error, hang, reset, garbage, bad_content, schema or cut"),
        req("billed", "number", "what was billed"),
        req("fault", "str", "the fault the plan gave it", nullable=True),
        opt("retry_after", "number", "the Retry-After seconds a refusal asked for"),
        opt("retry_at", "time", "a Retry-After HTTP date as epoch time"),
        opt("retry_after_header", "str", "the Retry-After header as sent"),
        opt("trickle", "bool", "a hang that sent its answer a byte at a time", False),
        opt("client_gone_at", "time", "when the fake found the client gone"),
        opt("stream", "bool", "answered as server-sent events (`stream: true`)", False),
        opt("chunks", "int", "a stream's pieces of content"),
        opt("chunks_sent", "int", "the pieces sent before the stream ended or was cut: "
            "what was billed"),
        opt("completion", "str", "\"info\" when the caller cannot have had the answer"),
        opt("pid", "int", "the calling process"),
    )),
    OpType("receiver", "request", "one request to the fake receiver, t = t_start", (
        req("key", "str", "the idempotency key"), req("job", "str", "the job"),
        req("kind", "str", "the effect's kind"),
        req("worker", "str", "the worker id it came with", nullable=True),
        req("n", "int", "the n-th request of this key"),
        req("t_start", "time", "when it arrived"), req("t_end", "time", "when it ended"),
        req("status", "int", "the HTTP status sent", nullable=True),
        req("outcome", "str", "applied, replayed, conflict, error, dropped or applied_late"),
        req("applied", "bool", "whether the effect was applied by this request"),
        opt("effect_id", "str", "the applied effect's id"),
        opt("completion", "str", "\"info\" when the sender cannot know whether it applied"),
        opt("pid", "int", "the calling process"),
    )),
    OpType("nemesis", "<fault>",
           "every fault the nemesis applied and its healing; `type` is the fault: kill, "
           "pause, resume, expire, skew, heartbeat_off, outage, outage_end, contention, "
           "contention_end, duplicate_submit, operator, server_crash, server_restart, "
           "connection_kill, statement_timeout, statement_timeout_end, statement_cancelled, "
           "row_lock, row_lock_end, row_lock_idle, error", (
               opt("target", "str", "the process or service it struck"),
               opt("pid", "int", "the process it struck"),
               opt("seconds", "number", "how long it lasts"),
           )),
    OpType("process", "spawn | exit", "the supervisor's lifecycle records", (
        req("name", "str", "the process's name"), req("role", "str", "worker or sender"),
        req("slot", "int", "its slot"), req("pid", "int", "its process id"),
        opt("code", "int", "its exit code"), opt("signal", "str", "the signal that ended it"),
        opt("killed", "bool", "True when the harness sent the signal", False),
        opt("log_tail", "str", "the end of its log, when it exited by itself"),
    )),
    OpType("process", "crashpoint", "the probe killed its process at a point", (
        req("pid", "int", "the process"), req("point", "str", "the point"),
        opt("job", "str", "the job it was working on"),
    )),
    OpType("process", "stall",
           "one thread of the process was left waiting, as a loaded machine would (the "
           "simulation's, or run-queue evidence)", (
               req("pid", "int", "the process"), req("seconds", "number", "how long"),
               opt("waited", "number", "how much of it the process was ready to run"),
           )),
    OpType("runner", "phase | submit", "the run's phases (`phase`) and its submissions "
           "(`submit`: job, payload_hash, result, duplicate)", ()),
)


def _need_text(f: Field, readers: dict[str, list[str]], kind: str) -> str:
    who = readers.get(f"{kind}.{f.name}", [])
    if f.need == REQUIRED:
        return "**required**: absent, the run stops (exit 2)"
    if f.need == EVIDENCE:
        names = ", ".join(f"`{n}`" for n in who) or "no check"
        return f"evidence: absent, {names} judge(s) `unknown`, naming it"
    return f"absent: read as {f.describe_default()}"


def reference_page(reads: dict[str, tuple[str, ...]] | None = None) -> str:
    """The Markdown of docs/history.md, from the schema and the checkers' READS."""
    if reads is None:
        load()
        reads = READS
    readers: dict[str, list[str]] = {}
    for invariant, items in reads.items():
        for item in items:
            readers.setdefault(item, []).append(invariant)
    out = [
        "# The history: operations",
        "",
        "<!-- Generated from chaos/engines/schema.py by `python -m chaos.docs.history_page --write "
        "docs/history.md`; a test fails when it is stale. Do not edit by hand. -->",
        "",
        "The history (`history.jsonl`) is a time-ordered list of operations. An adapter's "
        "`operations(db)` returns the `engine` ones, as a list of JSON objects; the harness "
        "records the rest. What `operations(db)` returns is checked as it is read: a "
        "required field missing or of the wrong type stops the run with exit 2 and a "
        "message naming the operation type, the field, an example and the method.",
        "",
        "Each field is **required** (the operation means nothing without it), defaulted "
        "(absent has one true reading, filled in when read), or **evidence** (absent has no "
        "true reading: the checks that read it judge `unknown`, naming the field). A field "
        "marked *may be None* takes None as the engine's word that it does not keep the "
        "value for that write.",
        "",
        "Types: " + "; ".join(f"`{k}` {v}" for k, v in KINDS.items()) + ".",
        "",
        "## Engine operations (your observer writes these)",
        "",
    ]
    for spec in ENGINE:
        out += [f"### `{spec.type}`", "", spec.doc[0].upper() + spec.doc[1:] + ".", "",
                "| field | type | what it is | if absent | read by |",
                "|---|---|---|---|---|"]
        for f in spec.fields:
            typ = f"`{f.kind}`" + (", may be None" if f.nullable and f.need != DEFAULTED
                                   or f.nullable and f.default is None else "")
            doc = f.doc + (f" (one of {', '.join(f'`{c}`' for c in f.choices)})"
                           if len(f.choices) > 1 and f.name != "actor" else "")
            who = ", ".join(f"`{n}`" for n in readers.get(f"{spec.type}.{f.name}", []))
            out.append(f"| `{f.name}` | {typ} | {doc} | {_need_text(f, readers, spec.type)} "
                       f"| {who or '-'} |")
        out.append("")
    out += ["## The snapshot", "",
            "`snapshot(db)` returns the store's final rows, table by table, checked as it is "
            "read: every table present, each field of its type; a field that may be None "
            "and is left out of a row is read as None (the engine does not keep it), any "
            "other missing field stops the run (exit 2). A table the engine does not keep "
            "(`spend` without `spend_records`) is None.", ""]
    for table, (doc, spec) in SNAPSHOT.items():
        out += [f"### `{table}`", "", doc[0].upper() + doc[1:] + ".", ""]
        if spec:
            out += ["| field | type | what it is |", "|---|---|---|"]
            out += [f"| `{f.name}` | `{f.kind}`" + (", may be None" if f.nullable else "")
                    + f" | {f.doc} |" for f in spec]
            out.append("")
    out += ["## Operations the harness records", "",
            "Written by the harness itself (the fakes' ledgers, the nemesis, the supervisor, "
            "the runner); listed so that a report can be read.", ""]
    for spec in HARNESS:
        out += [f"### `{spec.src}` `{spec.type}`", "", spec.doc[0].upper() + spec.doc[1:] + ".",
                ""]
        if spec.fields:
            out += ["| field | type | what it is |", "|---|---|---|"]
            out += [f"| `{f.name}` | `{f.kind}` | {f.doc} |" for f in spec.fields]
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    """`python -m chaos.docs.history_page [--write PATH]`: print the reference page, or write it."""
    parser = argparse.ArgumentParser(prog="python -m chaos.docs.history_page",
                                     description="the history's reference page")
    parser.add_argument("--write", metavar="PATH", help="write the page to PATH")
    args = parser.parse_args(argv)
    page = reference_page()
    if args.write:
        with open(args.write, "w", encoding="utf-8") as fh:
            fh.write(page)
        print(args.write)
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
