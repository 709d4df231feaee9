"""Provider outage against retry settings: the share of jobs parked by an outage of D seconds,
for the engine's defaults and for candidate defaults, in one run.

    python bench/outage.py [--outages 7.5,30,60,120,180,300,420] [--scale 0.05] [--jobs 50]
                           [--workers 2]

For each setting and each D: a fresh database of `jobs` documents, the fake provider down
(every call answered 503, no Retry-After) for the first D seconds, and real worker processes
(`python -m engine worker --exit-when-idle`) that run until every job is delivered or parked.
Time is scaled: the outage and the backoff bounds are multiplied by `scale` (0.05: a 300 s
outage takes 15 s), which leaves the share parked unchanged as long as a refused call is
much faster than the shortest backoff. Beside each measurement, `model` is the share a
pure sampling of the engine's own Backoff predicts (a job parks when its max_attempts - 1
waits add up to less than D). Prints a table; the figures are for reading, not asserting.
"""
from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from chaos.fakes import FakeProvider  # noqa: E402
from chaos.fakes.provider import TimedOutage  # noqa: E402
from engine import DOCUMENT, EngineConfig, open_store  # noqa: E402
from engine.retry import Backoff  # noqa: E402

DEFAULTS = EngineConfig()
#: name -> (max_attempts, backoff_base, backoff_cap): the defaults before this benchmark
#: chose new ones, the defaults now, and the other candidates it was run with.
SETTINGS = {
    "before: 5 x 0.5..30": (5, 0.5, 30.0),
    "defaults": (DEFAULTS.max_attempts, DEFAULTS.backoff_base, DEFAULTS.backoff_cap),
    "12 x 0.5..120": (12, 0.5, 120.0),
    "20 x 0.5..60": (20, 0.5, 60.0),
    "40 x 0.5..30": (40, 0.5, 30.0),
}
PARKED = tuple(sorted(DOCUMENT.parked_states))


def model_parked(attempts: int, base: float, cap: float, outage: float,
                 samples: int = 20000, seed: int = 1) -> float:
    """The share of jobs whose retries all fall inside an outage that began at their first
    call: the sum of `attempts` - 1 full-jitter waits is shorter than `outage`."""
    rng, backoff = random.Random(seed), Backoff(base, cap)
    short = sum(sum(backoff.delay(n, rng) for n in range(1, attempts)) < outage
                for _ in range(samples))
    return short / samples


def measure(attempts: int, base: float, cap: float, outage: float, scale: float, jobs: int,
            workers: int, folder: str) -> tuple[float, float]:
    """(share of jobs parked, seconds it took) for one setting and one scaled outage."""
    db = os.path.join(folder, "engine.db")
    store = open_store(db, synchronous="NORMAL")
    now = time.time()
    for i in range(jobs):
        store.submit(f"doc-{i}", DOCUMENT, {"title": f"Invoice {i}", "body": f"Dear Ada, {i}"},
                     now)
    policy = TimedOutage(outage * scale)
    with FakeProvider(os.path.join(folder, "provider.jsonl"), faults=policy) as provider:
        flags = {"db": db, "provider-url": provider.url, "max-attempts": attempts,
                 "max-claims": attempts + 5, "backoff-base": base * scale,
                 "backoff-cap": cap * scale, "poll-interval": min(0.005, base * scale / 4),
                 "synchronous": "NORMAL", "lease": 10, "call-timeout": 5}
        argv = [sys.executable, "-m", "engine", "worker", "--exit-when-idle",
                "--exit-with-parent"] + [a for k, v in flags.items() for a in (f"--{k}", str(v))]
        procs = [subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for _ in range(workers)]
        try:
            for proc in procs:
                proc.wait(timeout=outage * scale + 120)
        finally:
            for proc in procs:  # whoever started them ends them
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
    took = time.time() - now
    marks = ",".join("?" * len(PARKED))
    parked = store.query(f"SELECT COUNT(*) AS n FROM job WHERE state IN ({marks})",
                         PARKED)[0]["n"]
    store.close()
    return parked / jobs, took


def main(argv: list[str] | None = None) -> int:
    """Run the table; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outages", default="7.5,30,60,120,180,300,420",
                        help="outage lengths in (unscaled) seconds, comma-separated")
    parser.add_argument("--scale", type=float, default=0.05, help="time scale of the run")
    parser.add_argument("--jobs", type=int, default=50, help="jobs per measurement")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    args = parser.parse_args(argv)
    outages = [float(d) for d in args.outages.split(",")]
    print(f"{args.jobs} jobs, {args.workers} workers, time x {args.scale}; the provider "
          "answers 503 from the start for D seconds")
    print(f"{'setting':<22} {'attempts':>8} {'cap s':>6} {'D s':>6} {'parked':>7} "
          f"{'model':>6} {'run s':>6}")
    for name, (attempts, base, cap) in SETTINGS.items():
        for outage in outages:
            with tempfile.TemporaryDirectory() as folder:
                share, took = measure(attempts, base, cap, outage, args.scale, args.jobs,
                                      args.workers, folder)
            model = model_parked(attempts, base, cap, outage)
            print(f"{name:<22} {attempts:>8} {cap:>6g} {outage:>6g} {share:>7.0%} "
                  f"{model:>6.0%} {took:>6.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
