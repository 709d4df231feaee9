"""Whole chaos runs of the reference engine on PostgreSQL: real processes, real SIGKILL, a real
server (one the run starts for itself, or the tests' own through --pg-url), and mutants the
harness must catch there too."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import psycopg
import pytest

from chaos.checkers import INVARIANTS

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "not-in-any-record-7f3a"


def ninelives(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaos.commands.cli", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)


def only_run(out: Path) -> Path:
    runs = list(out.rglob("report.json"))
    assert len(runs) == 1, runs
    return runs[0].parent


def servers_on(port: str) -> list[int]:
    """The postgres processes listening on `port` (started by a run, so ours to look for)."""
    return [p.pid for p in psutil.process_iter(["name", "cmdline"])
            if p.info["name"] == "postgres" and f"-p {port}" in " ".join(p.info["cmdline"] or [])]


def test_smoke_passes_on_a_server_the_run_starts_and_stops(tmp_path):
    done = ninelives("run", "smoke", "--profile", "smoke", "--seed", "1", "--backend",
                     "postgres", "--out", str(tmp_path), "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((only_run(tmp_path) / "report.json").read_text())
    assert report["result"] == "pass" and report["backend"] == "postgres"
    db = report["database"]
    assert db["server"] == "started for the run" and db["name"].startswith("ninelives_smoke_")
    assert [v["name"] for v in report["verdicts"]] == list(INVARIANTS)
    assert {v["name"]: v["verdict"] for v in report["verdicts"] if v["verdict"] != "pass"} == {
        "operator-moves": "unknown", "durable-commits": "unknown"}
    assert report["faults_applied"].get("kill", 0) > 0
    assert "--backend postgres" in report["run_command"]
    assert not (only_run(tmp_path) / "engine.db").exists()
    port = db["target"].rsplit(":", 1)[1].split("/")[0]
    assert servers_on(port) == [], "the run's server outlived it"


def test_kill_storm_passes_on_an_existing_server_and_no_record_holds_its_password(
        tmp_path, pg_server):
    url = pg_server.url.replace("postgres@", f"postgres:{PASSWORD}@")  # trust: accepted
    done = ninelives("run", "kill-storm", "--profile", "smoke", "--seed", "1", "--backend",
                     "postgres", "--pg-url", url, "--out", str(tmp_path), "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run(tmp_path)
    report = json.loads((run / "report.json").read_text())
    assert report["result"] == "pass" and report["database"]["server"] == pg_server.url
    name = report["database"]["name"]
    assert report["faults_applied"].get("kill", 0) > 0
    assert PASSWORD not in done.stdout + done.stderr
    for path in run.rglob("*"):
        if path.is_file():
            assert PASSWORD not in path.read_text(errors="replace"), path
    # the run's database is kept on that server, as a SQLite run keeps its file
    with psycopg.connect(pg_server.url_for(name)) as conn:
        jobs = conn.execute("SELECT COUNT(*) FROM job").fetchone()[0]
    pg_server.drop_database(pg_server.url_for(name))
    assert jobs == report["scenario"]["run"]["jobs"]


@pytest.mark.parametrize("mutant, scenario, caught", [
    ("memo_check_skipped", "mutants/memo-hits", {"no-rebill-after-commit", "memo-consistent"}),
    ("poison_retried", "poison", {"retry-discipline"}),
])
def test_a_mutant_whose_patch_postgres_runs_is_caught_there(tmp_path, pg_server, mutant,
                                                             scenario, caught):
    # A few seeds, as `ninelives mutants` spends them: a mutant that needs a race to show
    # (a kill between a read and a write) may miss a seed.
    seen = []
    for seed in (1, 2, 3):
        out = tmp_path / f"seed{seed}"
        done = ninelives("run", scenario, "--profile", "smoke", "--seed", str(seed),
                         "--engine", f"chaos.mutants:{mutant}", "--backend", "postgres",
                         "--pg-url", pg_server.url, "--out", str(out), "--quiet")
        assert done.returncode in (0, 1), done.stdout + done.stderr
        report = json.loads((only_run(out) / "report.json").read_text())
        assert report["backend"] == "postgres"
        pg_server.drop_database(pg_server.url_for(report["database"]["name"]))
        failed = {v["name"] for v in report["verdicts"] if v["verdict"] == "fail"}
        seen.append(failed)
        if failed & caught:
            assert done.returncode == 1
            return
    pytest.fail(f"{mutant} was not caught by {sorted(caught)} on PostgreSQL in seeds 1-3: "
                f"{seen}")


def test_an_engine_of_sqlite_alone_is_refused_on_postgres_not_run_there(tmp_path):
    done = ninelives("run", "smoke", "--engine", "examples.article_engine.adapter:ARTICLE",
                     "--backend", "postgres", "--out", str(tmp_path), "--quiet")
    assert done.returncode == 2
    assert "--backend postgres: engine article runs on sqlite only" in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, says", [
    (["--pg-url", "postgresql://u@127.0.0.1:1/db"], "--pg-url needs --backend postgres"),
    (["--backend", "postgres", "--pg-url", "mysql://u:pw@127.0.0.1/db"],
     "--pg-url must be a postgresql://"),
    (["--backend", "postgres", "--pg-url", "postgresql://u:pw@127.0.0.1:1/postgres"],
     "--pg-url: cannot create database ninelives_smoke_"),
    (["--backend", "oracle"], "--backend"),
])
def test_bad_backend_input_is_exit_2_naming_the_flag_and_leaves_no_run(tmp_path, args, says):
    done = ninelives("run", "smoke", "--profile", "smoke", *args, "--out", str(tmp_path),
                     "--quiet", timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr and ":pw@" not in done.stderr
    assert not os.listdir(tmp_path)


def test_postgres_faults_crash_the_server_and_cut_connections_and_committed_work_survives(
        tmp_path):
    done = ninelives("run", "postgres-faults", "--profile", "smoke", "--seed", "1",
                     "--backend", "postgres", "--out", str(tmp_path), "--quiet")
    assert done.returncode in (0, 1), done.stdout + done.stderr
    run = only_run(tmp_path)
    report = json.loads((run / "report.json").read_text())
    applied = report["faults_applied"]
    assert applied.get("server_restart", 0) >= 1 and applied.get("connection_kill", 0) >= 1
    assert applied.get("statement_timeout", 0) >= 1
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    nemesis = [e["type"] for e in events if e["src"] == "nemesis"]
    assert nemesis.count("server_crash") == nemesis.count("server_restart") >= 1
    assert any(e.get("in_transaction") for e in events if e["type"] == "connection_kill")
    # each held lock's window closes, and a statement was cancelled inside one
    assert nemesis.count("statement_timeout") == nemesis.count("statement_timeout_end")
    assert nemesis.count("statement_cancelled") >= 1
    verdicts = {v["name"]: v for v in report["verdicts"]}
    # Every safety and liveness invariant holds through the crash and the cut connections.
    assert {n for n, v in verdicts.items() if v["verdict"] == "fail"} <= {"processes-survive"}
    assert verdicts["all-jobs-settle"]["verdict"] == "pass"
    assert verdicts["db-intact"]["verdict"] == "pass"
    # An engine process may die of a database fault (it exits 2 on a connection it cannot
    # reopen, or whose commit it cannot know): reported, and only for that reason.
    for error in verdicts["processes-survive"].get("errors", []):
        assert "exit code 2" in error["message"], error["message"]
    servers = servers_on(report["database"]["target"].rsplit(":", 1)[1].split("/")[0])
    assert servers == [], "the restarted server outlived its run"


@pytest.mark.parametrize("args", [[], ["--backend", "postgres", "--pg-url",
                                       "postgresql://postgres@127.0.0.1:1/postgres"]])
def test_server_faults_need_a_server_the_run_starts(tmp_path, args, pg_server):
    args = [a.replace("127.0.0.1:1/postgres", pg_server.url.split("@", 1)[1]) for a in args]
    done = ninelives("run", "postgres-faults", "--profile", "smoke", *args, "--out",
                     str(tmp_path), "--quiet", timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "faults.server_restart needs --backend postgres on a server the run starts" \
        in done.stderr


# -- every scenario on PostgreSQL ------------------------------------------------------------

#: Every scenario a user runs (not the mutant catalog's own), but postgres-faults (its own
#: test above: its engine processes may die of the server's faults) and power-loss (it needs a
#: server the run starts, not --pg-url's: tests/integration/test_power_loss_run.py).
SCENARIOS = sorted(p.stem for p in (ROOT / "scenarios").glob("*.toml")
                   if p.stem not in ("profiles", "postgres-faults", "power-loss"))
#: Run by `make test`; the rest are marked soak: `.venv/bin/python -m pytest -n 2 -m soak
#: tests/integration/test_postgres_campaign.py` runs them all (tens of seconds each).
#: (smoke and kill-storm have their own tests above, skew its own below.)
DEFAULT = {"db-contention", "operator-actions"}


@pytest.mark.parametrize("scenario", [
    pytest.param(name, marks=() if name in DEFAULT else (pytest.mark.soak,))
    for name in SCENARIOS])
def test_every_scenario_passes_on_postgres(tmp_path, pg_server, scenario):
    done = ninelives("run", scenario, "--profile", "smoke", "--seed", "1", "--backend",
                     "postgres", "--pg-url", pg_server.url, "--out", str(tmp_path), "--quiet")
    report = json.loads((only_run(tmp_path) / "report.json").read_text())
    pg_server.drop_database(pg_server.url_for(report["database"]["name"]))
    assert report["backend"] == "postgres"
    failed = {v["name"]: v["reason"] for v in report["verdicts"] if v["verdict"] == "fail"}
    assert done.returncode == 0, (failed, report["faults_unfired"], done.stderr[-2000:])


def skew_report(tmp_path: Path, *backend: str) -> tuple[dict, str]:
    done = ninelives("run", "skew", "--profile", "smoke", "--seed", "1", *backend, "--out",
                     str(tmp_path), "--quiet")
    report = json.loads((only_run(tmp_path) / "report.json").read_text())
    failed = {v["name"]: v["reason"] for v in report["verdicts"] if v["verdict"] == "fail"}
    assert done.returncode == 0, (failed, done.stderr[-2000:])
    return report, done.stdout


def test_skewed_workers_take_and_keep_no_lease_on_postgres_and_do_on_sqlite(tmp_path,
                                                                             pg_server):
    pg, pg_text = skew_report(tmp_path / "pg", "--backend", "postgres", "--pg-url",
                              pg_server.url)
    pg_server.drop_database(pg_server.url_for(pg["database"]["name"]))
    lite, lite_text = skew_report(tmp_path / "sqlite")
    # PostgreSQL: the server's clock places leases; a skewed worker is judged, and held.
    assert pg["skew"]["lease_clock"] == "store" and pg["skew"]["judged"] is True
    assert pg["skew"]["claims"] > 0
    assert (pg["skew"]["live_leases_taken"], pg["skew"]["leases_kept_past_end"]) == (0, 0)
    assert "skewed workers: leases on the store's clock" in pg_text
    # SQLite: each worker's clock does; the skewed one writes its leases a second long,
    # counted as expected, not failed.
    assert lite["skew"]["lease_clock"] == "worker" and lite["skew"]["judged"] is False
    assert lite["skew"]["leases_kept_past_end"] > 0
    assert "expected, not judged" in lite_text
    # lease-kept holds on both; on PostgreSQL with the skewed worker's holdings judged.
    kept = {r["backend"]: next(v for v in r["verdicts"] if v["name"] == "lease-kept")
            for r in (pg, lite)}
    assert kept["postgres"]["verdict"] == kept["sqlite"]["verdict"] == "pass"

