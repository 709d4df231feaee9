"""The reference engine rides out its PostgreSQL server: a whole postgres-faults run (the
server crashed and restarted, engine connections ended by the server mid-transaction,
statements cancelled, beside kills) in which every invariant with evidence holds,
processes-survive included: no worker or sender dies of its database."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ninelives(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaos.commands.cli", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)


def test_postgres_faults_pass_with_every_engine_process_surviving_its_server(tmp_path):
    done = ninelives("run", "postgres-faults", "--backend", "postgres", "--profile", "smoke",
                     "--seed", "1", "--out", str(tmp_path), "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr
    runs = list(tmp_path.rglob("report.json"))
    assert len(runs) == 1, runs
    report = json.loads(runs[0].read_text())
    assert report["result"] == "pass" and report["backend"] == "postgres"
    applied = report["faults_applied"]
    assert applied.get("server_restart", 0) > 0 and applied.get("connection_kill", 0) > 0
    verdicts = {v["name"]: v for v in report["verdicts"]}
    assert not [n for n, v in verdicts.items() if v["verdict"] == "fail"]
    for name in ("processes-survive", "all-jobs-settle", "db-intact", "fenced-writes",
                 "lease-exclusive", "cost-accounted", "outbox-bounded"):
        assert verdicts[name]["verdict"] == "pass", verdicts[name]
    assert verdicts["processes-survive"]["checked"] > 0
