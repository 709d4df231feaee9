"""The mutation score of the harness: how many one-line bugs in the reference engine's safety
code it catches, measured with cosmic-ray, the harness itself as the test suite.

    ninelives score [--modules engine/retry.py,...] [--seeds N|A..B] [--deep 1]
                    [--run [--run-seeds N|A..B]] [--jobs N] [--workdir DIR [--again]]

Why cosmic-ray: it applies each mutation to the module's file on disk, so every process the
harness starts (real workers and senders under `--run`, not only the simulation in the
harness's own process) imports the mutated engine. A tool that switches mutants inside one
Python process would leave the real-process campaigns testing the unmutated engine.

How: the repository's engine, harness and scenarios are copied into a work folder, once per
parallel worker (`--jobs`; nothing in the checkout is ever mutated). cosmic-ray hands each
mutant to a free worker, which mutates its own copy and runs `python -m chaos.score kill`
there. The kill command stops at the first failed invariant (the mutant is killed, exit 1):
first the simulation of every scenario for `--seeds` seeds at the smoke profile (fast), then,
for a mutant that survived, the strongest scenarios at the ci profile for `--deep` seeds, and
with `--run` real processes (`ninelives run` of RUN_SCENARIOS, `--run-seeds` seeds each),
which alone see what the simulation replaces (the HTTP client's sockets and deadlines). Operators that only make noise
on this code (bitwise and shift operators, powers, floor division and modulo in place of
arithmetic) are filtered out. Mutants listed in `mutation/equivalent.toml`, each with the
reason it cannot change behaviour, are left out of the score; the report lists every survivor
with its diff, so that each is either caught by a stronger check or argued equivalent there.

`--again` re-judges the survivors of a finished campaign (those of `--modules`) with the
harness and the rest of the engine as they are now (copies refreshed from the checkout; a
module under judgment must be unchanged, or its mutants would be elsewhere) and the stages
given now: strengthen a check, then ask it
again of only what survived; or give the survivors of engine/http.py real processes with
`--modules engine/http.py --again --run`.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from typing import Any

from chaos.reports.console import Progress, plural
from chaos.commands.flags import SEEDS_HELP, at_least, seeds, seeds_text
from chaos.commands.flags import seconds as flag_seconds
from chaos.spec.limits import MAX_WORKERS, excerpt
from chaos.score.checkout import (COPIED, HARNESS, ROOT, StaleCampaign, copy_checkout,
                                  refresh_engine, write_sitecustomize)
from chaos.score.report import TARGET, argued, equivalents, print_report, results, summarize

#: The engine's safety code, the modules the issue names.
MODULES = ("engine/store/sqlite.py", "engine/store/sqlite_open.py", "engine/worker.py",
           "engine/outbox.py", "engine/retry.py", "engine/http.py", "engine/store/operator.py",
           "engine/slots.py")
#: Every scenario a user runs, in the order that kills most mutants soonest.
SIM_SCENARIOS = ("smoke", "kill-storm", "provider-outage", "lost-lease", "outbox-ambiguous",
                 "operator-actions", "crash-loop", "poison", "duplicate-submit", "db-contention",
                 "everything", "slots", "skew")
#: The scenarios of the deep stage (ci profile): the ones whose faults reach the most code.
DEEP_SCENARIOS = ("everything", "outbox-ambiguous", "lost-lease", "provider-outage",
                  "crash-loop", "operator-actions", "db-contention", "slots")
RUN_SCENARIOS = ("smoke", "everything", "slots")
EXCLUDED_OPERATORS = (
    r"core/ReplaceBinaryOperator_.*_(BitOr|BitAnd|BitXor|LShift|RShift|Pow|FloorDiv|Mod)$",
    r"core/ReplaceBinaryOperator_(BitOr|BitAnd|BitXor|LShift|RShift|Pow|FloorDiv|Mod)_.*",
)


# -- the test command: is this mutant caught? ------------------------------------------------

def kill(seeds: range, deep: int, run: range, out: str) -> int:
    """Exit 1 when any invariant fails for the engine as it is on disk now (the mutant is
    killed), 0 when every stage passed. Prints which stage, scenario and seed caught it."""
    from chaos.spec.scenario import load_scenario
    from chaos.sim import SeededChoices, SimSpec, simulate
    from chaos.run.supervisor import run_owned
    stages = [("smoke", SIM_SCENARIOS, seeds), ("ci", DEEP_SCENARIOS, range(1, deep + 1))]
    for profile, names, chosen in stages:
        for name in names:
            scenario = load_scenario(name, profile)
            for seed in chosen:
                result = simulate(SimSpec(scenario, seed), SeededChoices(seed))
                # A thread outside the simulation's actors (no process) is the simulation's
                # failure, not the engine's: it kills nothing.
                if result.failed or any(e.get("process") for e in result.errors):
                    why = [v.name for v in result.failed] or ["a thread raised"]
                    print(f"killed: sim {name} --profile {profile} seed {seed}: "
                          f"{', '.join(why)}")
                    return 1
    for seed in run:  # a kill or a pause may take a fault's evidence away
        for name in RUN_SCENARIOS:
            done = run_owned([sys.executable, "-m", "chaos.commands.cli", "run", name, "--profile",
                              "smoke", "--seed", str(seed), "--out", out, "--quiet"],
                             capture_output=True, text=True)
            # Exit 2 with "error: adapter": the mutated engine raised under the reference's
            # adapter (before the guard, that exception escaped as exit 1): caught all the same.
            if done.returncode == 1 or (done.returncode == 2
                                        and "error: adapter " in done.stderr):
                print(f"killed: run {name} seed {seed}")
                return 1
    print("survived")
    return 0


# -- the campaign -----------------------------------------------------------------------------

def test_command(seeds: range, deep: int, run: range | None) -> str:
    """The command cosmic-ray runs for each mutant (`run`: the real-process seeds, if any)."""
    return (f"{sys.executable} -m chaos.score kill --seeds {seeds_text(seeds)} --deep {deep}"
            + (f" --run {seeds_text(run)}" if run else ""))


def write_config(workdir: str, modules: list[str], command: str, timeout: float,
                 urls: list[str]) -> str:
    """cosmic-ray's configuration for the campaign (the http distributor: one URL per
    worker, each mutating its own copy)."""
    config = os.path.join(workdir, "cosmic-ray.toml")
    with open(config, "w", encoding="utf-8") as fh:
        fh.write("[cosmic-ray]\n"
                 f"module-path = {json.dumps(modules)}\n"
                 f"timeout = {timeout}\nexcluded-modules = []\n"
                 f"test-command = {json.dumps(command)}\n\n"
                 "[cosmic-ray.distributor]\nname = \"http\"\n\n"
                 f"[cosmic-ray.distributor.http]\nworker-urls = {json.dumps(urls)}\n\n"
                 "[cosmic-ray.filters.operators-filter]\n"
                 f"exclude-operators = {json.dumps(list(EXCLUDED_OPERATORS))}\n")
    return config


def reset_survivors(session: str, modules: list[str], keep: set[str] = frozenset()) -> int:
    """Make the session's survivors in `modules` pending again (and the mutants whose run
    broke off, as a killed campaign leaves them), except the job ids in `keep`; how many."""
    conn = sqlite3.connect(session)
    marks = ",".join("?" * len(modules))
    try:
        with conn:  # cosmic-ray stores its outcomes by enum name
            rows = conn.execute(
                "SELECT r.job_id FROM work_results r JOIN mutation_specs m USING (job_id)"
                " WHERE ((UPPER(r.worker_outcome)='NORMAL' AND UPPER(r.test_outcome)="
                "'SURVIVED') OR UPPER(r.worker_outcome) IN ('EXCEPTION', 'ABNORMAL'))"
                f" AND m.module_path IN ({marks})", modules).fetchall()
            reset = [job for (job,) in rows if job not in keep]
            conn.executemany("DELETE FROM work_results WHERE job_id=?", [(j,) for j in reset])
            return len(reset)
    finally:
        conn.close()


def argued_jobs(session: str, engine_root: str, entries: list[dict[str, Any]]) -> set[str]:
    """The session's mutants an entry of mutation/equivalent.toml covers, read from the
    mutation specs and the engine's text as the campaign mutates it (`engine_root` holds
    engine/): they need no judging again."""
    conn = sqlite3.connect(session)
    try:
        specs = conn.execute("SELECT job_id, module_path, operator_name, start_pos_row,"
                             " definition_name FROM mutation_specs").fetchall()
    finally:
        conn.close()
    lines: dict[str, list[str]] = {}
    kept = set()
    for job, module, operator, row, function in specs:
        if module not in lines:
            with open(os.path.join(engine_root, module), encoding="utf-8") as fh:
                lines[module] = fh.read().splitlines()
        text = lines[module][row - 1] if 0 < row <= len(lines[module]) else ""
        probe = {"module": module, "operator": operator, "function": function,
                 "diff": f"-{text}\n"}
        if argued(probe, entries) is not None:
            kept.add(job)
    return kept


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mutation worker on port {port} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"mutation worker on port {port} did not start listening")


def serve_worker(port: int) -> None:
    """A cosmic-ray http worker on 127.0.0.1 only (its own command listens on every
    interface): mutates the files under the current directory and runs the test command."""
    from aiohttp import web
    from cosmic_ray.distribution.http import handle_mutate_and_test
    # The test commands it starts (cosmic-ray's own Popen, in sessions of their own) read
    # this to die with it: see main.
    os.environ[WORKER_PID] = str(os.getpid())
    app = web.Application()
    app.add_routes([web.post("/", handle_mutate_and_test)])
    web.run_app(app, host="127.0.0.1", port=port, print=None)


def campaign(workdir: str, modules: list[str], args: argparse.Namespace, fresh: bool) -> str:
    """Initialise (unless resuming), filter and execute the session over `args.jobs`
    workers; returns its path. Every worker and test command dies with this one."""
    from chaos.run.supervisor import run_owned, start_owned
    tools = os.path.dirname(sys.executable)
    session = os.path.join(workdir, "session.sqlite")
    copies = [os.path.join(workdir, f"worker-{i + 1}") for i in range(args.jobs)]
    # The engine as the campaign found it, kept aside: the mutants' positions are in this
    # text, and a copy left mutated by a campaign that was killed mid-mutant is put back.
    pristine = os.path.join(workdir, "engine")
    with Progress("preparing", len(copies), unit="copies") as shown:
        shown.update(0, detail="the checkout, one copy per worker")
        if not os.path.isdir(pristine):
            copy_checkout(workdir, ("engine",))
        elif args.again:
            refresh_engine(workdir, modules)
        for n, copy in enumerate(copies, 1):
            if not os.path.isdir(copy):
                copy_checkout(copy, COPIED)
            elif args.again:
                copy_checkout(copy, HARNESS)
            write_sitecustomize(copy)
            shutil.rmtree(os.path.join(copy, "engine"))
            shutil.copytree(pristine, os.path.join(copy, "engine"),
                            ignore=shutil.ignore_patterns("__pycache__"))
            shown.update(n)
    ports = [_free_port() for _ in copies]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    config = write_config(workdir, modules, test_command(args.seeds, args.deep,
                                                         args.run_seeds if args.run else None),
                          args.timeout, urls)
    if args.again and not fresh:
        keep = argued_jobs(session, workdir, equivalents())
        print(f"re-judging {reset_survivors(session, modules, keep)} survivors of "
              f"{', '.join(modules)} with the harness as it is now (argued ones kept)",
              flush=True)
    workers = []
    try:
        with Progress("preparing") as shown:
            shown.update(detail=f"starting {plural(len(copies), 'cosmic-ray worker')}")
            for copy, port in zip(copies, ports):
                env = {**os.environ, "PYTHONPATH": copy}  # the copy's engine, everywhere
                workers.append(start_owned(
                    [sys.executable, "-m", "chaos.score", "worker", "--port", str(port)],
                    cwd=copy, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            for port, proc in zip(ports, workers):
                _wait_listening(port, proc, time.monotonic() + 60)
        if fresh:  # init reads the modules of the first copy; each copy holds that text
            with Progress("preparing") as shown:
                shown.update(detail=f"listing the mutants of {', '.join(modules)}")
                for argv in ([os.path.join(tools, "cosmic-ray"), "init", config, session],
                             [os.path.join(tools, "cr-filter-operators"), session, config]):
                    run_owned(argv, cwd=copies[0],
                              env={**os.environ, "PYTHONPATH": copies[0]}, check=True)
        execute = start_owned([os.path.join(tools, "cosmic-ray"), "exec", config, session],
                              cwd=copies[0], env={**os.environ, "PYTHONPATH": copies[0]})
        try:
            _show_progress(execute, session)
        finally:
            if execute.poll() is None:
                execute.kill()
                execute.wait()
        if execute.returncode:
            raise subprocess.CalledProcessError(execute.returncode, execute.args)
    finally:
        for proc in workers:
            proc.terminate()
        for proc in workers:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return session


def _show_progress(execute: subprocess.Popen, session: str) -> None:
    """Until `execute` (cosmic-ray exec) ends: the mutants judged of the session's total, and
    how many survived the tests so far, read from its session database."""
    seen = None
    with Progress("judging mutants", unit="mutants") as shown:
        while True:
            ended = execute.poll() is not None  # then one last look, at the final counts
            try:
                with closing(sqlite3.connect(f"file:{session}?mode=ro", uri=True,
                                             timeout=1)) as db:
                    [total] = db.execute("SELECT count(*) FROM work_items").fetchone()
                    done, survived = db.execute(
                        "SELECT count(*), coalesce(sum(UPPER(test_outcome) = 'SURVIVED'), 0) "
                        "FROM work_results").fetchone()
                if (done, total, survived) != seen:
                    seen = (done, total, survived)
                    shown.update(done, total=total,
                                 detail=f"{survived} survived the tests so far")
            except sqlite3.Error:
                pass  # cosmic-ray is writing; the next look will do
            if ended:
                return
            try:
                execute.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass


#: The environment variable that tells a test command which cosmic-ray worker started it.
WORKER_PID = "NINELIVES_SCORE_WORKER_PID"


def die_with_worker() -> None:
    """A test command's first act: die with the worker that started it. cosmic-ray starts
    it with no parent-death signal, and the worker dies with the campaign; a worker that
    died before this request (the campaign SIGKILLed while the command started) makes it
    exit at once, rather than judge its mutant for minutes with no one to tell."""
    from chaos.run.supervisor import die_with_parent
    owner = os.environ.pop(WORKER_PID, "")
    die_with_parent(int(owner) if owner.isdigit() else None)


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv)[:1] == ["kill"]:
        die_with_worker()  # before anything else: a campaign killed meanwhile ends it
    parser = argparse.ArgumentParser(prog="ninelives score", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    k = sub.add_parser("kill", help="(the test command cosmic-ray runs in its work folder)")
    k.add_argument("--seeds", type=seeds, default="2", help=f"sim seeds: {SEEDS_HELP}")
    k.add_argument("--deep", type=at_least(0), default=1, help="deep sim seeds 1..N (0: none)")
    k.add_argument("--run", type=seeds, default=range(0), help=f"real-process seeds: "
                   f"{SEEDS_HELP} (default none)")
    w = sub.add_parser("worker", help="(a cosmic-ray worker on 127.0.0.1, in its copy)")
    w.add_argument("--port", type=at_least(1), required=True, help="the port to serve on")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.command == "kill":
        with tempfile.TemporaryDirectory(prefix="ninelives-kill-") as out:
            return kill(args.seeds, args.deep, args.run, out)
    if args.command == "worker":
        serve_worker(args.port)
        return 0
    return score(args)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `ninelives score` subcommand and its arguments."""
    add_arguments(sub.add_parser(
        "score", help="the mutation score: one-line bugs in the engine the harness catches"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--modules", default=",".join(MODULES),
                        help="comma-separated engine files to mutate (default: the safety code)")
    parser.add_argument("--seeds", type=seeds, default="2",
                        help=f"sim seeds of every scenario at the smoke profile (the fast "
                             f"stage): {SEEDS_HELP} (default 2)")
    parser.add_argument("--deep", type=at_least(0), default=1,
                        help="sim seeds 1..N of each deep scenario at the ci profile, for "
                             "survivors (default 1; 0: none)")
    parser.add_argument("--run", action="store_true",
                        help="also run real processes for mutants the simulation missed")
    parser.add_argument("--run-seeds", type=seeds, default="3",
                        help=f"with --run: seeds of each real-process scenario, {SEEDS_HELP} "
                             "(default 3: a kill or a pause can take one seed's evidence away)")
    parser.add_argument("--timeout", type=flag_seconds, default=None,
                        help="seconds per mutant before it counts as caught by a timeout "
                             "(default: 180, and 150 more per real run with --run)")
    parser.add_argument("--jobs", type=at_least(1, MAX_WORKERS), default=os.cpu_count() or 1,
                        help="mutants judged at once, each in its own copy (default: cores, "
                             f"at most {MAX_WORKERS})")
    parser.add_argument("--workdir", help="a work folder to use, or to resume if it has a session")
    parser.add_argument("--again", action="store_true",
                        help="with --workdir: judge the survivors again, harness refreshed")


def engine_modules(text: str) -> list[str]:
    """The engine files `--modules` names (comma-separated, relative to the checkout). Raises
    ValueError naming `--modules` and the first entry that is not a Python file under engine/
    of this checkout (the campaign mutates only its copies of engine/: any other path, such
    as /etc/passwd or ../x.py, would give no mutant and a score of nothing), or when it
    names none."""
    modules = [m.strip() for m in text.split(",") if m.strip()]
    if not modules:
        raise ValueError(f"--modules names no engine file, got {excerpt(text, 40)}")
    engine = os.path.join(ROOT, "engine") + os.sep
    for module in modules:
        path = os.path.normpath(os.path.join(ROOT, module))
        why = ("is not a path relative to the checkout" if os.path.isabs(module) else
               "is not a file under engine/" if not path.startswith(engine) else
               "is not a .py file" if not module.endswith(".py") else
               "does not exist" if not os.path.exists(path) else
               "is not a regular file" if not os.path.isfile(path) else None)
        if why:
            raise ValueError(f"--modules: {excerpt(module, 60)} {why}; it takes engine files "
                             f"such as {MODULES[0]},{MODULES[1]}")
    return [os.path.relpath(os.path.normpath(os.path.join(ROOT, m)), ROOT) for m in modules]


def check_workdir(workdir: str | None) -> None:
    """Raises ValueError naming `--workdir` when it is something other than a folder this
    process may write in (or a path where one can be made)."""
    if workdir is None:
        return
    if os.path.exists(workdir):
        if not os.path.isdir(workdir):
            raise ValueError(f"--workdir: {excerpt(workdir, 60)} is not a folder")
        if not os.access(workdir, os.W_OK | os.X_OK):
            raise ValueError(f"--workdir: {excerpt(workdir, 60)} is not writable")
        return
    parent = os.path.dirname(os.path.abspath(workdir))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--workdir: {excerpt(workdir, 60)} cannot be made "
                         f"({os.path.relpath(parent)} is not a writable folder)")


def score(args: argparse.Namespace) -> int:
    """Run (or resume) a campaign and print its report; exit 0 when the score meets TARGET."""
    if args.timeout is None:
        args.timeout = 180.0 + (150.0 * len(args.run_seeds) * len(RUN_SCENARIOS)
                                if args.run else 0)
    try:
        modules = engine_modules(args.modules)
        check_workdir(args.workdir)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if shutil.which("cosmic-ray", path=os.path.dirname(sys.executable)) is None:
        print("error: cosmic-ray is not installed in this environment (make test installs it)",
              file=sys.stderr)
        return 2
    workdir = args.workdir or tempfile.mkdtemp(prefix="ninelives-score-")
    os.makedirs(workdir, exist_ok=True)
    fresh = not os.path.exists(os.path.join(workdir, "session.sqlite"))
    if args.again and fresh:
        print(f"error: --again needs a --workdir with a campaign in it; {workdir} has none",
              file=sys.stderr)
        return 2
    started = time.perf_counter()
    deep = f"deep seeds 1..{args.deep}" if args.deep else "no deep stage"
    stages = [f"sim seeds {seeds_text(args.seeds)}", deep] + (
        [f"then real runs, seeds {seeds_text(args.run_seeds)}"] if args.run else [])
    print(f"mutation campaign in {workdir} ({'new' if fresh else 'resumed'}, {args.jobs} "
          f"workers): {', '.join(modules)}; {', '.join(stages)}", flush=True)
    from chaos.run.supervisor import evidence_in
    try:
        with evidence_in(workdir):  # an interrupted campaign resumes from its workdir
            session = campaign(workdir, modules, args, fresh)
    except StaleCampaign as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = summarize(results(session), equivalents())
    print_report(summary, session)
    print(f"took {time.perf_counter() - started:.0f} s")
    if summary["score"] is None:  # exit 1 is a judgement, and there was none
        print(f"error: no mutant of {', '.join(modules)} was judged (killed, survived or timed "
              f"out): no score; session {session}", file=sys.stderr)
        return 2
    return 0 if summary["score"] >= TARGET else 1
