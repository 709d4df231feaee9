"""Contract-suite fixtures: every adapter present, a fresh store per test, the fakes on
127.0.0.1, and one real run per adapter (a worker and a sender started with the adapter's own
command line, under the harness's own supervisor) whose every process is ended in a
finally."""
from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from chaos.contract import ProcessContext, load_engine
from chaos.fakes import FakeProvider, FakeReceiver
from chaos.run.supervisor import Supervisor

#: name -> the --engine spec of every adapter the suite knows.
KNOWN = {"reference": "reference",
         "article": "examples.article_engine.adapter:ARTICLE",
         "toy": "examples.toy_engine.adapter:TOY",
         "dbos": "examples.dbos_pipeline.adapter:DBOS_ENGINE"}


def _present(spec: str) -> bool:
    """Whether the adapter's module exists (a module that exists but fails to load is
    present, and fails every test with its reason)."""
    if spec == "reference":
        return True
    module = spec.partition(":")[0]
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


#: the adapters this suite runs against, decided once at import time.
PRESENT = [name for name, spec in KNOWN.items() if _present(spec)]

PAYLOAD = {"title": "Contract check", "body": "Alpha beta Gamma delta. Epsilon Zeta eta."}
OTHER_PAYLOAD = {"title": "Another payload", "body": "Theta iota."}
DEADLINE = 60.0


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll `condition` until it returns something truthy; fail naming `what` at the deadline."""
    end = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)  # the poll interval of a condition wait, not a wait for time to pass


@pytest.fixture(scope="session", params=PRESENT)
def spec(request) -> str:
    return KNOWN[request.param]


@pytest.fixture(scope="session")
def engine(spec):
    """The adapter, loaded and validated as `--engine` loads it."""
    return load_engine(spec)


@pytest.fixture
def db(tmp_path) -> str:
    return str(tmp_path / "store.db")


@pytest.fixture
def installed(engine, db) -> str:
    engine.install(db)
    return db


def logs(log_dir: Path) -> str:
    """The tail of every process log in `log_dir`."""
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                     for p in sorted(log_dir.glob("*.log")))


@dataclass
class Run:
    """What one real run of an adapter's processes left behind."""

    engine: Any
    db: str
    job: str
    pids: dict[str, set[int]]
    terminal: str
    reached: bool
    operations: list[dict] = field(default_factory=list)
    progress: dict = field(default_factory=dict)
    snapshot: dict = field(default_factory=dict)
    calls: list[dict] = field(default_factory=list)
    requests: list[dict] = field(default_factory=list)
    error: str | None = None
    logs: str = ""


@pytest.fixture(scope="session")
def run(engine, tmp_path_factory) -> Run:
    """Submit one job, start one worker and one sender with the adapter's commands against
    the real fakes, wait until the job is done and its effects sent (or a deadline), then
    end the processes and read everything back. Never raises: the tests judge the result."""
    here = tmp_path_factory.mktemp("run")
    db, job = str(here / "store.db"), "contract-run-1"
    terminal = engine.pipeline.steps[-1].done
    result = Run(engine, db, job, {"worker": set(), "sender": set()}, terminal, False)
    provider = FakeProvider(here / "provider.jsonl").start()
    receiver = FakeReceiver(here / "receiver.jsonl").start()
    ctx = ProcessContext(db=db, provider_url=provider.url, receiver_url=receiver.url,
                         engine={}, poll_interval=0.02)
    processes = Supervisor(lambda role, slot, n: engine.command(role, ctx), log_dir=str(here))
    try:
        engine.install(db)
        engine.submit(db, job, PAYLOAD)
        for role in ("worker", "sender"):
            result.pids[role].add(processes.spawn(role).pid)
        end = time.monotonic() + DEADLINE
        while time.monotonic() < end and not result.reached:
            progress = engine.progress(db)
            result.reached = (progress["states"].get(terminal, 0) == 1
                              and not progress.get("unsent"))
            if len(processes.alive()) < 2:
                break  # a process died on its own: no point waiting
            time.sleep(0.02)  # condition poll
    except Exception as exc:  # the tests report it; the fixture must still clean up
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        processes.close()
        provider.close()
        receiver.close()
    result.logs = logs(here)
    try:
        result.operations = engine.operations(db)
        result.progress = engine.progress(db)
        result.snapshot = engine.snapshot(db)
    except Exception as exc:
        result.error = (result.error or "") + f" reading back: {type(exc).__name__}: {exc}"
    result.calls, result.requests = provider.entries(), receiver.entries()
    return result
