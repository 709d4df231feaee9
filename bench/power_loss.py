"""What each SQLite store setting loses to power cuts: the settings table.

    python bench/power_loss.py [--profile ci] [--seeds 1] [--only FULL/WAL,postgresql/off,...]
                               [--out DIR]

Runs scenarios/power-loss.toml (the machine's power cut under the store six times at the ci
profile: every process killed at once, the writes no fsync covered dropped by the
lost-fsync file system, chaos.powerloss) with the reference engine on each pair of
`synchronous` (OFF, NORMAL, FULL, EXTRA) and journal mode (WAL, rollback DELETE), through
chaos.reference.store_settings (the engine offers FULL and NORMAL in WAL itself), and prints,
summed over the seeds' cuts, per setting:

- promised: whether SQLite promises that an acknowledged commit survives the cut;
- acknowledged: operations the store showed just before the cuts (job state changes,
  memos, outbox rows, sent marks, spend records);
- lost ops / jobs: of those, gone after the cut, and the jobs they belonged to;
- memos, sent marks: the lost memos and sent marks among them;
- re-billed: provider calls for a (job, step) made after the cut that lost its memo;
- dup effects: effects applied at the receiver more than once (the idempotency key must
  survive the cut; the receiver's ledger is the ground truth);
- verdict: durable-commits (fails only where durability is promised) and any other
  invariant that failed.

Two rows are PostgreSQL: a server the run starts, its data directory on the lost-fsync file
system, killed with the engine at each cut and recovered from its WAL (chaos.powerloss), the
reference engine at synchronous=FULL (synchronous_commit=on) and NORMAL (off).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from chaos.run.backends import Backend  # noqa: E402
from chaos.contract import validate  # noqa: E402
from chaos.reference.adapter import ReferenceEngine  # noqa: E402
from chaos.reference.store_settings import JOURNALS, SYNCHRONOUS, StoreSettingsEngine  # noqa: E402
from chaos.run.runner import run_campaign  # noqa: E402
from chaos.spec.scenario import load_scenario  # noqa: E402

ROWS = [(s, j) for j in JOURNALS for s in reversed(SYNCHRONOUS)]
#: PostgreSQL's rows: synchronous_commit, and the engine's setting that gives it
PG_ROWS = {"on": "FULL", "off": "NORMAL"}


def measure(run_dir: str, report: dict) -> Counter:
    """One run's figures (see the module text)."""
    m: Counter = Counter()
    events = [json.loads(line) for line in open(os.path.join(run_dir, "history.jsonl"))]
    calls = [e for e in events if e.get("src") == "provider" and e.get("type") == "call"]
    for cut in (e for e in events if e.get("type") == "power_loss"):
        m["cuts"] += 1
        m["acknowledged"] += cut["acknowledged"]
        m["lost"] += cut["lost_count"]
        m["jobs"] += cut["lost_jobs"]
        m["memos"] += len(cut["lost_memos"])
        m["sent"] += len(cut["lost_sent"])
        m["dropped_bytes"] += cut["dropped_bytes"]
        lost = {tuple(x) for x in cut["lost_memos"]}
        m["rebilled"] += sum(1 for c in calls if (c.get("job"), c.get("step")) in lost
                             and c["t"] > cut["t"])
    snapshot = json.load(open(os.path.join(run_dir, "snapshot.json")))
    applied = Counter((a["job"], a["kind"]) for a in snapshot.get("receiver_applied", []))
    m["dup_effects"] = sum(n - 1 for n in applied.values() if n > 1)
    verdicts = {v["name"]: v["verdict"] for v in report["verdicts"]}
    m["durable_fail"] += verdicts.get("durable-commits") == "fail"
    for name, verdict in verdicts.items():
        if verdict == "fail" and name != "durable-commits":
            m[f"fail:{name}"] += 1
    return m


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="ci")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--only", default="", help="rows as SYNC/JOURNAL or postgresql/on|off, "
                                                   "comma-separated")
    parser.add_argument("--out", default=None, help="run folders (default: a temporary one)")
    args = parser.parse_args(argv)
    only = args.only.split(",") if args.only else None
    rows = [r for r in ROWS if not only or f"{r[0]}/{r[1]}" in only]
    pg_rows = [c for c in PG_ROWS if not only or f"postgresql/{c}" in only]
    out = args.out or tempfile.mkdtemp(prefix="ninelives-power-loss-")
    scenario = load_scenario("power-loss", args.profile)
    head = (f"{'synchronous':<14}{'journal':<9}{'promised':<9}{'cuts':>5}{'acknowledged':>13}"
            f"{'lost ops':>9}{'jobs':>6}{'memos':>6}{'sent marks':>11}{'re-billed':>10}"
            f"{'dup effects':>12}  verdict")
    print(f"power-loss, profile {args.profile}, seeds 1..{args.seeds}; run folders in {out}"
          "; postgres on|off: synchronous_commit")
    print(head)
    for sync, journal in rows:
        engine = validate(StoreSettingsEngine(sync, journal))
        print(row(sync, journal, engine.durability({})[0],
                  *measure_seeds(scenario, engine, os.path.join(out, f"{sync}-{journal}"),
                                 args.seeds)), flush=True)
    for commit in pg_rows:
        setting = {"synchronous": PG_ROWS[commit]}
        engine = validate(ReferenceEngine())
        print(row(f"postgres {commit}", "WAL", engine.durability(setting)[0],
                  *measure_seeds(replace(scenario, engine={**scenario.engine, **setting}),
                                 engine, os.path.join(out, f"postgresql-{commit}"), args.seeds,
                                 Backend("postgres"))), flush=True)
    return 0


def measure_seeds(scenario, engine, out: str, seeds: int,
                  backend: Backend = Backend()) -> tuple[Counter, list[str]]:
    """The figures summed over seeds 1..`seeds`, and the runs that stopped, saying why."""
    total: Counter = Counter()
    stopped = []
    for seed in range(1, seeds + 1):
        try:
            result = run_campaign(scenario, seed, engine, out, progress=False, backend=backend)
        except Exception as exc:  # a store the cut corrupted stops the run: say so
            stopped.append(f"seed {seed} stopped: {str(exc).splitlines()[0][:120]}")
            continue
        total.update(measure(result.run_dir, result.report))
    return total, stopped


def row(sync: str, journal: str, promised: bool, total: Counter, stopped: list[str]) -> str:
    others = sorted(k[5:] for k in total if k.startswith("fail:"))
    verdict = ("durable-commits FAIL" if total["durable_fail"] else "durable-commits pass")
    verdict += f"; also failed: {', '.join(others)}" if others else ""
    verdict = "; ".join(stopped) if stopped and not total["cuts"] else verdict
    return (f"{sync:<14}{journal:<9}{'yes' if promised else 'no':<9}"
            f"{total['cuts']:>5}{total['acknowledged']:>13}{total['lost']:>9}"
            f"{total['jobs']:>6}{total['memos']:>6}{total['sent']:>11}{total['rebilled']:>10}"
            f"{total['dup_effects']:>12}  {verdict}")


if __name__ == "__main__":
    sys.exit(main())
