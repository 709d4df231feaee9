"""`ninelives`: one command for the engine (`ninelives engine ...`) and the harness.

    ninelives run SCENARIO [--seed N | --seeds N|A..B [--shard I/N]] [--profile P] [--engine E]
                  [--out DIR] [--quiet]
                  [--engine-set NAME=VALUE ...]
                  [--backend sqlite|postgres [--pg-url postgresql://...]]
    ninelives replay RUN [--tries K] [--out DIR]
    ninelives check RUN            (its verdicts go to check.json and check.html)
    ninelives report RUN [--format html,junit,md]
    ninelives sweep [SCENARIO] [--lease 0.5,1,2,4] [--heartbeat on,off] [--latency DIST]
                    [--seeds N|A..B] [--profile P] [--engine E] [--out DIR]
                    [--backend sqlite|postgres [--pg-url postgresql://...]]
    ninelives sim SCENARIO [--seed N | --seeds N|A..B [--shard I/N]] [--engine E] [--shrink]
    ninelives sim --replay FILE
    ninelives explore SCENARIO [--engine E] [--budget 5m] [--seed N] [--corpus DIR] [--out DIR]
                      [--shard I/N]
    ninelives merge FOLDER... [--out DIR] [--require-exercised]   the shards as one report
    ninelives annotate FOLDER                  failures as GitHub Actions workflow commands
    ninelives mutants [--seeds N|A..B] [--profile P] [--only NAME,...] [--out DIR]
                      [--backend sqlite|postgres [--pg-url postgresql://...]]
    ninelives score [--modules M,...] [--seeds N|A..B] [--deep N] [--run [--run-seeds N|A..B]]
    ninelives demo [--jobs N] [--workers N] [--seed N] [--out DIR]
    ninelives doctor [--engine E] [--engine-set NAME=VALUE ...] [--json]
    ninelives engine ...        (see `ninelives engine --help`)

--seed N is one seed; --seeds N is seeds 1..N and --seeds A..B seeds A to B, in every command.
Exit codes: 0 every invariant with evidence holds, 1 an invariant failed, 2 the harness could
not run (bad input included, an adapter that raised, a bug of the harness's own).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from chaos.run.backends import add_backend_flags
from chaos.commands.flags import SEEDS_HELP, at_least, parse_seconds, seeds
from chaos.spec.limits import MAX_JOBS, MAX_WORKERS
from chaos.run.shards import SHARD_HELP, shard

EXIT_ERROR = 2


REQUIRE = ("an invariant that passed without reaching any of the dangerous situations "
           "that exercise it ('pass, not exercised') makes the result an error, exit 2")

CHECK_WRITES = ("Rerun the checkers (and situations) on a saved run's history and snapshot. "
                "The verdicts go to check.json and check.html in the run folder (replaced by "
                "the next check); the run's own report.json, report.html, junit.xml and "
                "summary.md are never rewritten, except that a run killed before its checks "
                "gets its missing verdicts filled into report.json (and its pages rendered) "
                "once, with the history and snapshot rebuilt from what it appended.")


#: The commands that live in modules of their own: command -> (module, the function that adds
#: its parser, the function that runs it). A module is imported only when its command is the
#: one given (or for --help and a command not known): these import much that the others do
#: not need (the simulation, the mutant catalog, PostgreSQL's client).
OWN_COMMANDS = {
    "sim": ("chaos.sim.cli", "add_parser", "cmd_sim"),
    "explore": ("chaos.explore.cli", "add_parser", "cmd_explore"),
    "mutants": ("chaos.mutants.matrix", "add_parser", "cmd_mutants"),
    "doctor": ("chaos.engines.doctor", "add_parser", "cmd_doctor"),
    "merge": ("chaos.reports.merge", "add_parser", "cmd_merge"),
    "annotate": ("chaos.reports.annotate", "add_parser", "cmd_annotate"),
    "score": ("chaos.score", "add_parser", "score"),
}
COMMANDS = frozenset({"engine", "run", "replay", "check", "report", "sweep", "demo",
                      *OWN_COMMANDS})


def own_command(name: str, part: str):
    """The function of command `name` of OWN_COMMANDS that adds its parser (`part` "parser")
    or runs it ("run"), its module imported now."""
    import importlib
    module, add_parser, run = OWN_COMMANDS[name]
    return getattr(importlib.import_module(module), add_parser if part == "parser" else run)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line's parser; with `only`, one of its commands, the parsers of the
    commands in OWN_COMMANDS are added only when `only` names them."""
    parser = argparse.ArgumentParser(prog="ninelives", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("engine", help="the reference engine: worker, send, submit, status, ...")
    p = sub.add_parser("run", help="run a chaos scenario against an engine")
    p.add_argument("scenario", help="a scenario file, or a name from scenarios/")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--seed", type=int, default=1,
                       help="the seed of the fault plan (default 1)")
    which.add_argument("--seeds", type=seeds, default=None,
                       help=f"a run per seed, one after another: {SEEDS_HELP}; the campaign's "
                            "campaign.json, summary.md, junit.xml and report.html go in --out")
    p.add_argument("--shard", type=shard, default=None, help=SHARD_HELP)
    p.add_argument("--profile", default=None, help="smoke, ci (default) or soak")
    p.add_argument("--engine", default="reference", help="reference, or module:object")
    p.add_argument("--engine-set", action="append", default=[], metavar="NAME=VALUE",
                   help="an engine setting over the scenario's [engine] table, e.g. slots=4 "
                        "(a TOML value; repeat for more); recorded, and given again by the "
                        "rerun and replay commands")
    add_backend_flags(p)
    p.add_argument("--out", default="reports", help="where run folders go (default reports)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--require-exercised", action="store_true", help=REQUIRE)
    p = sub.add_parser("replay", help="rerun a saved run's plan and say how often it reproduces")
    p.add_argument("run", help="a run folder (with report.json)")
    p.add_argument("--tries", type=at_least(1), default=1,
                   help="how many times to replay the plan (default 1)")
    p.add_argument("--out", default=None, help="where replay runs go (default: beside it)")
    p = sub.add_parser("check", help="rerun the checkers on a saved run's history",
                       description=CHECK_WRITES)
    p.add_argument("run", help="a run folder (with history.jsonl and snapshot.json)")
    p.add_argument("--require-exercised", action="store_true", help=REQUIRE)
    p = sub.add_parser("report", help="render a saved run's report.html, junit.xml, summary.md")
    p.add_argument("run", help="a run folder (with report.json)")
    p.add_argument("--format", default="html,junit,md", help="any of html,junit,md")
    p = sub.add_parser("sweep", help="measure duplicate spend and recovery across lease settings")
    p.add_argument("scenario", nargs="?", default="lease-sweep",
                   help="a scenario file, or a name from scenarios/ (default lease-sweep)")
    p.add_argument("--lease", default="0.5,1,2,4",
                   help="lease lengths in seconds, separated by commas (default 0.5,1,2,4)")
    p.add_argument("--heartbeat", default="on,off", help="on, off or on,off (default on,off)")
    p.add_argument("--latency", default=None,
                   help="fixed:S | uniform:A:B | lognormal:P50:P99 | file:PATH (seconds)")
    p.add_argument("--seeds", type=seeds, default="1",
                   help=f"the seeds every cell runs: {SEEDS_HELP} (default 1)")
    p.add_argument("--profile", default=None, help="smoke, ci (default) or soak")
    p.add_argument("--engine", default="reference", help="reference, or module:object")
    add_backend_flags(p, "every cell's runs (one server for the whole sweep)")
    p.add_argument("--out", default="reports", help="where the sweep folder goes")
    p = sub.add_parser("demo", help="the engine end to end against the fakes, no faults")
    p.add_argument("--jobs", type=at_least(1, MAX_JOBS), default=300,
                   help=f"documents to submit (default 300, at most {MAX_JOBS:,})")
    p.add_argument("--workers", type=at_least(1, MAX_WORKERS), default=2,
                   help=f"worker processes (default 2, at most {MAX_WORKERS})")
    p.add_argument("--seed", type=int, default=1, help="the seed of the documents (default 1)")
    p.add_argument("--out", default="reports/demo", help="where the demo's folder goes")
    for name in OWN_COMMANDS:
        if only in (None, name):
            own_command(name, "parser")(sub)
    return parser


def command_of(argv: list[str]) -> str | None:
    """The command `argv` names when it is one of ninelives's (its first word that is not an
    option), else None: a parser of every command then says what went wrong."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in COMMANDS else None


def cmd_run(args: argparse.Namespace) -> int:
    from chaos.run.backends import Backend
    from chaos.contract import load_engine
    from chaos.reports.report_text import summary
    from chaos.run.runner import run_campaign
    from chaos.spec.scenario import load_scenario, parse_engine_set
    backend = Backend(args.backend, args.pg_url)  # BackendError (exit 2) names the flag
    engine = load_engine(args.engine)
    scenario = load_scenario(args.scenario, args.profile, engine,
                             parse_engine_set(args.engine_set))
    if args.shard is not None and args.seeds is None:
        raise ValueError(f"--shard {args.shard} splits --seeds A..B among shards; give --seeds")
    if args.seeds is not None:
        from chaos.run.seed_runs import run_seeds
        return run_seeds(args, scenario, engine, backend)
    print(f"ninelives run {scenario.name} (profile {scenario.profile}, seed {args.seed}, "
          f"engine {args.engine}, backend {backend.name}): {scenario.run.jobs} jobs, "
          f"{scenario.run.workers} workers, {scenario.run.chaos:.1f} s of chaos",
          file=sys.stderr, flush=True)
    result = run_campaign(scenario, args.seed, engine, args.out, engine_spec=args.engine,
                          backend=backend, progress=not args.quiet)
    if args.require_exercised:
        from chaos.reports.report import require_exercised, write_report
        from chaos.run.runner import render_reports
        write_report(result.run_dir, require_exercised(result.report))
        render_reports(result.run_dir)
    print(summary(result.report))
    html = os.path.join(result.run_dir, "report.html")
    if os.path.exists(html):
        print(f"open the report: {html}")
    return result.exit_code


def load_report(run: str) -> dict:
    """report.json of a run folder (a partial one, of a killed run, marked so); raises
    ValueError naming the file."""
    from chaos.run.saved import load_report as load
    return load(run)


def cmd_replay(args: argparse.Namespace) -> int:
    from chaos.run.backends import Backend
    from chaos.contract import load_engine
    from chaos.spec.plan import FaultPlan
    from chaos.reports.report import RESULTS
    from chaos.run.runner import run_campaign
    from chaos.spec.scenario import load_scenario
    from chaos.run.supervisor import evidence_in
    from contextlib import nullcontext
    if args.tries < 1:
        raise ValueError(f"--tries must be at least 1, got {args.tries}")
    report = load_report(args.run)
    engine = load_engine(report["engine"])
    # The settings the run was given on the command line, over the file's [engine] table
    from chaos.run.runfiles import REDACTED
    given = {k: v for k, v in (report["scenario"].get("engine_set") or {}).items()
             if v != REDACTED}  # a secret was not kept: the engine's default, or its env
    scenario = load_scenario(report["scenario"]["path"], report["profile"], engine, given)
    plan = FaultPlan.from_json(report["plan"])
    # The same backend; on PostgreSQL a server of its own (a --pg-url's password is not kept)
    backend = Backend(report.get("backend", "sqlite"))
    out = args.out or os.path.join(os.path.dirname(os.path.dirname(args.run.rstrip("/"))),
                                   "replays")
    # A partial run (killed before its checks) has no verdicts to reproduce: its plan is
    # rerun, and the tries' own verdicts decide the exit code.
    want = None if report.get("partial") else [(v["name"], v["verdict"])
                                               for v in report["verdicts"]]
    same, codes = 0, []
    for i in range(args.tries):
        print(f"try {i + 1}/{args.tries}: {scenario.name}, seed {plan.seed}", file=sys.stderr,
              flush=True)
        # an interrupt before this try made its folder names the last try's
        with evidence_in(result.run_dir) if i else nullcontext():
            result = run_campaign(scenario, plan.seed, engine, out, plan=plan,
                                  engine_spec=report["engine"], backend=backend)
        got = [(v["name"], v["verdict"]) for v in result.report["verdicts"]]
        codes.append(result.exit_code)
        same += got == want
        differing = [f"{n}: {a} -> {b}" for (n, a), (_, b) in zip(want or [], got) if a != b]
        print(f"try {i + 1}: {result.report['result']}"
              + (f" (differs: {'; '.join(differing)})" if differing else
                 " (same verdicts)" if want is not None else "")
              + f"  {result.run_dir}")
    if want is None:
        worst = 1 if 1 in codes else max(codes)
        print(f"{args.run} is a partial run (it ended before its checks): nothing to "
              f"reproduce; its saved plan was replayed {args.tries} time(s), "
              f"{RESULTS[worst]}")
        return worst
    print(f"reproduced {same}/{args.tries}: the plan is replayed exactly; the operating "
          "system's scheduling is not (use `ninelives sim` for exact replays)")
    return 0 if same == args.tries else 1


def cmd_check(args: argparse.Namespace) -> int:
    from chaos.run.recheck import check_folder_lines, keep_check, now, recheck
    from chaos.reports.report_text import (incomplete_lines, result_line, situations_lines,
                                           verdict_table)
    from chaos.run.saved import load_run
    saved = load_run(args.run)
    report = recheck(saved, args.require_exercised, now())
    paths = keep_check(saved, report)
    print(verdict_table(report))
    for line in situations_lines(report):
        print(line)
    for line in incomplete_lines(report) + [result_line(report)]:
        print(line)
    for line in check_folder_lines(report, paths):
        print(line)
    return report["exit_code"]


def cmd_sweep(args: argparse.Namespace) -> int:
    from chaos.run.backends import Backend, check_backend, command_backend
    from chaos.contract import load_engine
    from chaos.spec.latency import parse_latency
    from chaos.spec.scenario import load_scenario
    from chaos.commands.sweep import run_sweep, table
    backend = Backend(args.backend, args.pg_url)  # BackendError (exit 2) names the flag
    try:
        leases = sorted({parse_seconds(x) for x in args.lease.split(",") if x.strip()})
    except ValueError as exc:
        raise ValueError(f"--lease must be seconds separated by commas; each {exc}") from None
    words = {"on": True, "off": False}
    if not leases:
        raise ValueError(f"--lease needs seconds separated by commas, got {args.lease[:40]!r}")
    if not set(args.heartbeat.split(",")) <= set(words):
        raise ValueError(f"--heartbeat must be on, off or on,off, got {args.heartbeat!r}")
    if args.latency:
        try:
            parse_latency(args.latency)
        except ValueError as exc:
            raise ValueError(f"--latency: {exc}") from None
    base = load_scenario(args.scenario, args.profile)
    check_backend(load_engine(args.engine), backend)
    with command_backend(backend) as shared:  # a server had before the sweep's folder
        sweep = run_sweep(base, leases, [words[w] for w in args.heartbeat.split(",")],
                          args.latency, args.seeds, args.engine, args.out, backend=shared)
    print(table(sweep))
    print()
    for rec in sweep["recommendation"].values():
        print(rec["text"])
    print(f"\nsweep: {os.path.join(sweep['folder'], 'sweep.json')}\n"
          f"plot: {os.path.join(sweep['folder'], 'sweep.html')}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from chaos.reports.render import parse_formats, render_run
    from chaos.reports.report_text import incomplete_lines
    formats = parse_formats(args.format)
    report = load_report(args.run)
    for path in render_run(args.run, formats):
        print(path)
    for line in incomplete_lines(report):
        print(line)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to the engine CLI or a harness command; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "engine":
        from chaos.reference.adapter import engine_cli
        return engine_cli(argv[1:])
    try:
        args = build_parser(command_of(argv)).parse_args(argv)
    except KeyboardInterrupt as stop:
        return interrupted(stop)
    from chaos.engines.adapter_guard import AdapterError
    from chaos.run.runner import HarnessError
    from chaos.spec.scenario import ScenarioError
    from chaos.run.supervisor import stop_on_signals
    restore_signals = stop_on_signals()  # SIGTERM unwinds like Ctrl-C
    try:
        if args.command == "demo":
            from chaos.reference.demo import run_demo
            return run_demo(args.jobs, args.workers, args.seed, args.out)
        if args.command in OWN_COMMANDS:
            return own_command(args.command, "run")(args)
        return {"run": cmd_run, "replay": cmd_replay, "check": cmd_check,
                "sweep": cmd_sweep, "report": cmd_report}[args.command](args)
    except AdapterError as exc:  # its traceback is in the run folder, when there was one
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except (ScenarioError, HarnessError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (Stopped)
        return interrupted(stop)
    except Exception as exc:  # exit 1 says an invariant failed, and nothing else does
        return internal_error(exc)
    finally:
        restore_signals()


def internal_error(exc: Exception) -> int:
    """Print the one line of a command that a bug of the harness's own ended (every process
    it started is stopped by then), its traceback kept in a file the line names; return 2."""
    import tempfile
    import traceback
    from chaos.engines.adapter_guard import described, hide
    fd, path = tempfile.mkstemp(prefix="ninelives-error-", suffix=".txt")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(hide("".join(traceback.format_exception(exc))))
    print(f"error: internal: {described(exc)} (a bug of ninelives, no verdict on the engine; "
          f"traceback: {path})", file=sys.stderr, flush=True)
    return EXIT_ERROR


def interrupted(stop: KeyboardInterrupt) -> int:
    """Print the one line of a command stopped by Ctrl-C or SIGTERM (its processes are
    ended by then: each `finally` on the way stopped what it started) and return its exit
    code: 130 for SIGINT, 143 for SIGTERM."""
    import signal
    from chaos.run.supervisor import exit_code_of
    code = exit_code_of(stop)
    folder = getattr(stop, "evidence", None)
    where = (f"its partial evidence is in {folder}" if folder and os.path.isdir(folder)
             else "it had written no run folder yet")
    print(f"interrupted ({signal.Signals(code - 128).name}): every process it started is "
          f"stopped; {where}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
