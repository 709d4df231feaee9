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
    return subprocess.run([sys.executable, "-m", "chaos.cli", *args], cwd=ROOT, text=True,
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
    assert {v["name"] for v in report["verdicts"] if v["verdict"] != "pass"} == {
        "operator-moves"}
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


def test_a_mutant_of_sqlite_code_is_refused_on_postgres_not_reported_as_missed(tmp_path):
    done = ninelives("run", "mutants/zombies", "--engine", "chaos.mutants:no_token_on_complete",
                     "--backend", "postgres", "--out", str(tmp_path), "--quiet")
    assert done.returncode == 2
    assert "--backend postgres: engine mutant:no_token_on_complete runs on sqlite only" \
        in done.stderr
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
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    nemesis = [e["type"] for e in events if e["src"] == "nemesis"]
    assert nemesis.count("server_crash") == nemesis.count("server_restart") >= 1
    assert any(e.get("in_transaction") for e in events if e["type"] == "connection_kill")
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
