"""Harness power: CPU seconds until each planted bug is caught, for each way of searching.

    python bench/harness_power.py [--quick] [--budget 120] [--reps 5] [--only NAME,...]
                                  [--searches random,swarm,explore,aim] [--situations 60]

Rows: every mutant of the catalog (chaos.reference.mutants.catalog: the reference engine with
one safety mechanism removed) and every planted bug of the engines we did not design
(examples/*/planted.py). Columns, each a way of searching in simulation, shown once the
command it needs exists (else named "not available" under the table):

- random: `ninelives sim SCENARIO --seeds A..` (seeds in order) on the row's scenario;
- swarm: the same with `--swarm` (each seed its own mix of the scenario's faults);
- explore: `ninelives explore SCENARIO --seed R --corpus EMPTY` (coverage-guided; it stops at
  its first failure, so a row whose engine fails another invariant first is "other");
- aim: the aimed scenarios, `scenarios/aim-*.toml`, in sim: a few seeds of each in turn,
  round after round (one the row's engine refuses is left out; none left: "n/a").

A cell is the median over --reps repetitions (each from its own seeds: 1, 1001, 2001, ...;
explore: its own --seed and an empty corpus) of the CPU seconds its child processes used until
the first catch: a failing run folder in which one of the row's expected invariants failed.
It counts everything the command spends: starting Python, the seeds before, and the failing
seed run again to write its folder, as a user pays it. CPU is read with
resource.getrusage(RUSAGE_CHILDREN) before and after each child (the searches run one at a
time), not the wall clock: the machine is shared. A child is stopped at the row's --budget of
CPU seconds (RLIMIT_CPU), so a miss reads ">BUDGET"; once more than half the repetitions
missed, the median is a miss and the rest are not run. "k/5" follows a median when only k of
the repetitions caught it.

Under the table: the share of the situations catalog (chaos.situations.CATALOG) that
`ninelives explore everything` reaches on the reference engine within --situations seconds.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from chaos.reference.mutants.catalog import CATALOG  # noqa: E402

NINELIVES = [sys.executable, "-m", "chaos.commands.cli"]
SEARCHES = ("random", "swarm", "explore", "aim")
#: mutants --quick runs: one per family of bug (zombie write, outbox, backoff, heartbeat)
QUICK_MUTANTS = ("no_token_on_complete", "mark_sent_before_send", "jitter_narrowed",
                 "heartbeat_ignores_rowcount")
#: seeds a child of the aimed search runs of one aimed scenario before the next one's turn
AIM_SEEDS = 3


@dataclass(frozen=True)
class Target:
    """One row: an engine with one bug, the scenario that provokes it, what catches it."""

    name: str
    spec: str
    scenario: str
    expect: tuple[str, ...]
    profile: str = "ci"
    engine_set: dict = field(default_factory=dict)

    def engine_args(self) -> list[str]:
        args = ["--engine", self.spec, "--profile", self.profile]
        for name, value in self.engine_set.items():
            args += ["--engine-set", f"{name}={value}"]
        return args


#: The toy has no heartbeat, so it refuses a call timeout as long as the lease: its calls
#: must end inside the shortest lease the scenarios set (lost-lease's and the aimed ones', 1 s).
TOY = {"call_timeout": 0.8}
#: the planted bugs of the example engines, with the scenario tests/examples/test_planted.py
#: catches each in
PLANTED = (
    Target("toy:unfenced_completion", "examples.toy_engine.planted:UNFENCED_COMPLETION",
           "lost-lease", ("fenced-writes",), engine_set=TOY),
    Target("toy:half_jitter", "examples.toy_engine.planted:HALF_JITTER", "provider-outage",
           ("retry-discipline",), engine_set=TOY),
    Target("toy:effects_apart", "examples.toy_engine.planted:EFFECTS_APART", "smoke",
           ("effects-complete",), engine_set=TOY),
    Target("toy:sent_before_send", "examples.toy_engine.planted:SENT_BEFORE_SEND", "smoke",
           ("effects-complete",), engine_set=TOY),
    Target("article:sent_before_send", "examples.article_engine.planted:SENT_BEFORE_SEND",
           "smoke", ("effects-complete",)),
    Target("sqs:unfenced_delete", "examples.sqs_engine.planted:UNFENCED_DELETE", "lost-lease",
           ("fenced-writes",)),
    Target("sqs:heartbeat_any", "examples.sqs_engine.planted:HEARTBEAT_ANY", "lost-lease",
           ("fenced-writes",)),
)


def mutant_targets() -> list[Target]:
    return [Target(m.name, m.spec, m.scenario, m.expect, m.profile) for m in CATALOG]


# -- what exists ---------------------------------------------------------------------------

def help_text(*command: str) -> str | None:
    """The --help of a ninelives command, or None when there is no such command."""
    done = subprocess.run([*NINELIVES, *command, "--help"], cwd=ROOT, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)
    return done.stdout if done.returncode == 0 else None


def aimed_scenarios() -> list[str]:
    return sorted(glob.glob(os.path.join(ROOT, "scenarios", "aim-*.toml")))


def available() -> dict[str, str | None]:
    """search -> None when it can run, else why not."""
    sim = help_text("sim") or ""
    return {"random": None if sim else "ninelives sim did not start",
            "swarm": None if "--swarm" in sim else "ninelives sim has no --swarm",
            "explore": None if help_text("explore") else "no ninelives explore",
            "aim": None if aimed_scenarios() else "no scenarios/aim-*.toml"}


# -- one child, measured --------------------------------------------------------------------

def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_limit(seconds: float):
    """A preexec function: the child is ended (SIGXCPU) after `seconds` of CPU."""
    soft = max(1, math.ceil(seconds))

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 2))
    return limit


def caught_in(folder: str, expect: tuple[str, ...]) -> bool:
    """Whether one of `expect` failed in the run folder's report."""
    try:
        with open(os.path.join(folder, "report.json")) as f:
            verdicts = json.load(f)["verdicts"]
    except (OSError, ValueError, KeyError):
        return False
    return any(v.get("name") in expect and v.get("verdict") == "fail" for v in verdicts)


def failure_folder(line: str, after_fail: bool) -> str | None:
    """The run folder a failing seed's (or exploration's) line names, or None."""
    if line.startswith("run folder: "):
        return line[len("run folder: "):].strip()
    if after_fail and line.startswith("  ") and os.path.isdir(line.strip()):
        return line.strip()
    return None


@dataclass
class Outcome:
    """One child's CPU seconds, whether it caught the bug, and how it ended."""

    cpu: float
    caught: bool
    other: bool = False        # it stopped at the failure of another invariant
    refused: bool = False      # it could not run (exit 2 before any seed)


def run_child(argv: list[str], expect: tuple[str, ...], budget: float) -> Outcome:
    """Run one search command until it shows a failing run folder in which one of `expect`
    failed (then it is killed), until it ends, or until `budget` CPU seconds."""
    before = children_cpu()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True,
                            preexec_fn=cpu_limit(budget))
    caught = other = after_fail = ran = False
    try:
        for line in proc.stdout:
            ran = ran or line.startswith(("seed ", "ninelives "))
            folder = failure_folder(line, after_fail)
            after_fail = line.startswith("seed ") and ": FAIL " in line
            if folder is None:
                continue
            if caught_in(folder, expect):
                caught = True
                break
            if line.startswith("run folder: "):  # explore stops at its first failure
                other = True
                break
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    return Outcome(children_cpu() - before, caught, other,
                   refused=proc.returncode == 2 and not ran)


# -- the searches ---------------------------------------------------------------------------

def random_search(target: Target, rep: int, budget: float, out: str, swarm: bool = False
                  ) -> Outcome:
    start = 1 + 1000 * rep
    argv = [*NINELIVES, "sim", target.scenario, "--seeds", f"{start}..{start + 999}",
            *target.engine_args(), "--out", out, "--quiet", *(["--swarm"] if swarm else [])]
    return run_child(argv, target.expect, budget)


def explore_search(target: Target, rep: int, budget: float, out: str) -> Outcome:
    corpus = os.path.join(out, f"corpus-{rep}")
    argv = [*NINELIVES, "explore", target.scenario, *target.engine_args(), "--seed", str(rep),
            "--corpus", corpus, "--out", out, "--quiet", "--shrink-budget", "1",
            "--budget", f"{max(60, budget * 4):.0f}s"]   # the wall clock is CPU's loose cap
    return run_child(argv, target.expect, budget)


def aim_search(target: Target, rep: int, budget: float, out: str) -> Outcome:
    """A few seeds of each aimed scenario in turn, round after round, until a catch or the
    budget; scenarios the row's engine refuses are left out."""
    usable, spent, first = aimed_scenarios(), 0.0, 1 + 1000 * rep
    for round_ in range(1000):
        for scenario in list(usable):
            left = budget - spent
            if left < 1:
                return Outcome(spent, False)
            start = first + AIM_SEEDS * round_
            argv = [*NINELIVES, "sim", scenario, "--seeds", f"{start}..{start + AIM_SEEDS - 1}",
                    "--engine", target.spec, *_engine_sets(target), "--out", out, "--quiet"]
            outcome = run_child(argv, target.expect, left)
            spent += outcome.cpu
            if outcome.caught:
                return Outcome(spent, True)
            if outcome.refused:
                usable.remove(scenario)
        if not usable:
            return Outcome(spent, False, refused=True)
    return Outcome(spent, False)


def _engine_sets(target: Target) -> list[str]:
    return [arg for name, value in target.engine_set.items()
            for arg in ("--engine-set", f"{name}={value}")]


RUNNERS = {"random": random_search,
           "swarm": lambda t, r, b, o: random_search(t, r, b, o, swarm=True),
           "explore": explore_search, "aim": aim_search}


def measure(target: Target, search: str, reps: int, budget: float) -> str:
    """The cell: the median CPU seconds to the first catch over `reps` repetitions."""
    times, notes = [], set()
    for rep in range(reps):
        out = tempfile.mkdtemp(prefix="harness-power-")
        try:
            outcome = RUNNERS[search](target, rep, budget, out)
        finally:
            shutil.rmtree(out, ignore_errors=True)
        if outcome.refused:
            return "n/a"
        if outcome.other:
            notes.add("other")
        times.append(outcome.cpu if outcome.caught else math.inf)
        if sum(t == math.inf for t in times) > reps // 2:
            break
    caught = sum(t != math.inf for t in times)
    median = statistics.median_low(times + [math.inf] * (reps - len(times)))
    if median == math.inf:
        return "other" if notes == {"other"} and not caught else f">{budget:g}"
    return f"{median:.1f}" + ("" if caught == reps else f" ({caught}/{reps})")


# -- the situations reached -----------------------------------------------------------------

def situations_share(seconds: float) -> str:
    """How many of the situations catalog `ninelives explore everything` reaches on the
    reference engine within `seconds`."""
    try:
        from chaos.situations import CATALOG as SITUATIONS, recognise  # noqa: F401
    except ImportError:
        return "situations reached: not available (no chaos.situations CATALOG, recognise)"
    if help_text("explore") is None:
        return "situations reached: not available (no ninelives explore)"
    with tempfile.TemporaryDirectory(prefix="harness-power-") as out:
        argv = [*NINELIVES, "explore", "everything", "--engine", "reference", "--budget",
                f"{seconds:g}s", "--corpus", os.path.join(out, "corpus"), "--out", out,
                "--quiet"]
        before = children_cpu()
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL)
        cpu = children_cpu() - before
    line = next((x for x in done.stdout.splitlines() if x.startswith("situations reached:")),
                None)
    if line is None:
        return (f"situations reached: explore printed no count (exit {done.returncode}): "
                f"{done.stdout.strip().splitlines()[-1:] or done.stderr[-200:]}")
    return (f"{line} on the reference engine in {seconds:g} s of `ninelives explore everything` "
            f"({cpu:.0f} CPU s)")


# -- the table ------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"the mutants {', '.join(QUICK_MUTANTS)} and the planted bugs, "
                        "1 repetition, 15 CPU s a cell, no situations share")
    parser.add_argument("--budget", type=float, help="CPU seconds a cell (default 120)")
    parser.add_argument("--reps", type=int, help="repetitions a cell (default 5)")
    parser.add_argument("--only", help="rows by name, comma-separated (a mutant or a planted "
                        "bug such as toy:half_jitter)")
    parser.add_argument("--searches", default=",".join(SEARCHES),
                        help="columns, comma-separated (default: every one)")
    parser.add_argument("--situations", type=float,
                        help="seconds of explore for the situations share (default 60; 0: "
                        "leave it out)")
    args = parser.parse_args(argv)
    budget = args.budget or (15.0 if args.quick else 120.0)
    reps = args.reps or (1 if args.quick else 5)
    situations = args.situations if args.situations is not None else (0 if args.quick else 60)
    print("command: python bench/harness_power.py" +
          "".join(f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv)),
          flush=True)
    targets = [t for t in mutant_targets() if not args.quick or t.name in QUICK_MUTANTS]
    targets += list(PLANTED)
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {t.name for t in mutant_targets() + list(PLANTED)}
        if unknown:
            parser.error(f"--only: no row {sorted(unknown)[0]!r}")
        targets = [t for t in mutant_targets() + list(PLANTED) if t.name in wanted]
    chosen = [s.strip() for s in args.searches.split(",") if s.strip()]
    for search in chosen:
        if search not in SEARCHES:
            parser.error(f"--searches: no search {search!r} (known: {', '.join(SEARCHES)})")
    why_not = available()
    columns = [s for s in chosen if why_not[s] is None]
    print(f"CPU seconds to the first catch, median of {reps}, at most {budget:g} CPU s a cell;"
          f" load {os.getloadavg()[0]:.1f}", flush=True)
    width = max(len(t.name) for t in targets) + 2
    where = max(len(t.scenario) for t in targets) + 2
    print(f"{'bug':<{width}}{'scenario':<{where}}" + "".join(f"{c:>12}" for c in columns),
          flush=True)
    for target in targets:
        cells = [measure(target, c, reps, budget) for c in columns]
        print(f"{target.name:<{width}}{target.scenario:<{where}}"
              + "".join(f"{c:>12}" for c in cells), flush=True)
    for search in chosen:
        if why_not[search] is not None:
            print(f"{search}: not available ({why_not[search]})")
    if situations:
        print(situations_share(situations))
    print(f"load {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
