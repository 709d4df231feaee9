"""`ninelives explore` as a user runs it: on the reference engine it explores to its budget,
keeps a corpus that the next exploration replays first, and ends with the table of
situations; on a catalog mutant that random simulation catches in about one seed of ten it
finds the failure within seconds and prints a replay command that reproduces it; an engine
that cannot be simulated is refused naming the capability."""
from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

ADAPTERS = '''
from chaos.reference import ReferenceEngine


class Outside(ReferenceEngine):
    name = "outside"
    capabilities = ReferenceEngine.capabilities - {"in_process"}


OUTSIDE = Outside()
'''


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "explore_adapters.py").write_text(ADAPTERS)
    return tmp_path


def ninelives(workdir: Path, *args: str, timeout: float = 240.0) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(workdir), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "chaos.commands.cli", *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=timeout)


def explain(ran: subprocess.CompletedProcess) -> str:
    return f"$ {' '.join(ran.args)}\nexit {ran.returncode}\n{ran.stdout}\n{ran.stderr}"


def test_explore_keeps_a_corpus_that_the_next_exploration_replays_first(workdir):
    ran = ninelives(workdir, "explore", "everything", "--profile", "smoke", "--budget", "6s",
                    "--corpus", "corpus")
    assert ran.returncode == 0, explain(ran)
    assert "situations reached:" in ran.stdout and "first reached" in ran.stdout
    assert "+kill-mid-step" in ran.stdout or "kill-mid-step" in ran.stdout
    kept = sorted((workdir / "corpus").glob("*.json"))
    assert kept, explain(ran)
    assert "replaying the corpus" not in ran.stdout
    again = ninelives(workdir, "explore", "everything", "--profile", "smoke", "--budget", "3",
                      "--corpus", "corpus")
    assert again.returncode == 0, explain(again)
    assert f"replaying the corpus first: {len(kept)} schedules from corpus" in again.stdout
    assert "(corpus, seed" in again.stdout  # what it reached, it reached from the corpus
    assert " from the\ncorpus)" not in again.stdout and " (0 from the corpus)" not in \
        again.stdout


def test_explore_finds_a_rare_mutant_and_prints_a_replay_command_that_reproduces_it(workdir):
    # no_token_on_complete: random `sim everything --profile smoke` catches it in 1 seed of 10
    ran = ninelives(workdir, "explore", "everything", "--profile", "smoke", "--engine",
                    "chaos.mutants:no_token_on_complete", "--budget", "60", "--corpus",
                    "corpus", "--out", "out", "--shrink-budget", "8")
    assert ran.returncode == 1, explain(ran)
    # the zombie's unfenced completion: its own write (fenced-writes), or the job moved under
    # the new holder's feet (lease-kept), whichever the first failing schedule shows first
    failed = re.search(r"FAIL after .*?: ([a-z-]+ \([a-z-]+\))", ran.stdout)
    assert failed and failed.group(1) in ("fenced-writes (zombie-write)",
                                          "lease-kept (lease-abandoned)"), explain(ran)
    path = next(line.split(": ", 1)[1] for line in ran.stdout.splitlines()
                if line.startswith("counterexample: "))
    assert f"replay it: ninelives sim --replay {path}" in ran.stdout
    saved = json.loads(Path(workdir, path).read_text())
    assert saved["engine"] == "chaos.mutants:no_token_on_complete" and saved["swarm"]
    replayed = ninelives(workdir, "sim", "--replay", path, "--out", "replays")
    assert replayed.returncode == 1, explain(replayed)
    assert f"reproduced: the saved schedule failed {failed.group(1)}" in replayed.stdout
    # the failure is kept in the corpus, and the next exploration starts with it
    again = ninelives(workdir, "explore", "everything", "--profile", "smoke", "--engine",
                      "chaos.mutants:no_token_on_complete", "--budget", "60", "--corpus",
                      "corpus", "--out", "out", "--shrink-budget", "1", "--quiet")
    assert again.returncode == 1 and "and 1 schedules (corpus" in again.stdout, explain(again)


def test_explore_refuses_an_engine_without_in_process_naming_the_capability(workdir):
    ran = ninelives(workdir, "explore", "smoke", "--engine", "explore_adapters:OUTSIDE",
                    "--budget", "5")
    assert ran.returncode == 2, explain(ran)
    errors = [line for line in ran.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "in_process" in errors[0] and "OUTSIDE" in errors[0], \
        explain(ran)
    assert "Traceback" not in ran.stderr


@pytest.mark.parametrize("value", ["0", "5x", "-3m", "m"])
def test_a_bad_budget_exits_2_naming_the_flag(workdir, value):
    ran = ninelives(workdir, "explore", "smoke", "--budget", value)
    assert ran.returncode == 2 and "argument --budget" in ran.stderr, explain(ran)


@pytest.mark.soak
@pytest.mark.parametrize("engine", ["reference", "examples.toy_engine.adapter:TOY",
                                    "examples.article_engine.adapter:ARTICLE"])
def test_a_minute_of_exploration_finds_no_failure_in_a_correct_engine(workdir, engine):
    ran = ninelives(workdir, "explore", "everything", "--engine", engine, "--budget", "60",
                    "--corpus", "corpus", "--out", "out", timeout=600)
    assert ran.returncode == 0, explain(ran)
