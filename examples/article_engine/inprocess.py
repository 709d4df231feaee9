"""The article engine in `ninelives sim` (the contract's in-process hooks, `chaos.sim.threads`).

The article keeps its settings and its identity in module globals (LEASE_SECONDS, WORKER, ...),
so every simulated process gets its own copy of `engine` and `sender`, configured from the
very flags a real run passes (`ArticleEngine.command` parsed by the CLI's own parser). In each
copy the names the article reads the outside world through are the process's: `now` its
virtual clock, `random` its seeded source, `threading` its threads and events (the heartbeat
thread is an actor of the process, killed with it), `WORKER` its id (sim:<pid>). Its HTTP
function, `calls.post_json`, is answered by the simulation's fakes. The article's code itself
runs unchanged.
"""
from __future__ import annotations

import importlib.util
import json
import logging
from contextlib import contextmanager
from types import ModuleType, SimpleNamespace
from typing import Any, Callable, Iterator

from . import calls

PACKAGE = __name__.rpartition(".")[0]


class ArticleErrors:
    """What `calls.post_json` raises, for the simulation's fakes to raise in its place."""

    @staticmethod
    def status(url: str, status: int, body: Any, retry_after: str | None,
               now: float) -> Exception:
        # The article reads no Retry-After (its published bug), in any form.
        if status == 429 or status >= 500:
            return calls.HTTPRetryable(f"POST {url}: HTTP {status}")
        return calls.HTTPRefused(f"POST {url}: HTTP {status}")

    @staticmethod
    def reset(url: str) -> Exception:
        return ConnectionError(f"POST {url}: RemoteDisconnected: Remote end closed connection "
                               "without response")

    @staticmethod
    def timeout(url: str, seconds: float) -> Exception:
        return TimeoutError(f"POST {url}: timed out after {seconds} s")


def fresh(name: str) -> ModuleType:
    """A new copy of module `name` of this package, with globals of its own."""
    spec = importlib.util.find_spec(f"{PACKAGE}.{name}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: The article's log lines in a simulation go nowhere: its processes have no log file there.
QUIET = logging.getLogger(f"{PACKAGE}.sim")
QUIET.addHandler(logging.NullHandler())
QUIET.propagate = False


class ArticleInProcess:
    """The hooks `chaos.sim.threads` runs the article engine with; `adapter` is the
    ArticleEngine (or its variant) whose flags each process is configured from."""

    errors = ArticleErrors()

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter

    @contextmanager
    def route(self, post: Callable[[str, Any, dict, float], tuple[int, Any]]) -> Iterator[None]:
        """`calls.post_json` answered by `post`: the parsed JSON of a 2xx, or BadOutput for an
        answer that is not JSON, as the real function gives."""
        saved = calls.post_json

        def routed(url: str, body: Any, headers: dict, timeout: float) -> Any:
            _, answer = post(url, body, headers, timeout)
            if isinstance(answer, str):
                try:
                    return json.loads(answer)
                except ValueError:
                    raise calls.BadOutput(f"POST {url}: answer is not JSON: "
                                          f"{answer[:80].encode()!r}") from None
            return answer

        calls.post_json = routed
        try:
            yield
        finally:
            calls.post_json = saved

    def install(self, db: str, now_sql: str) -> None:
        self.adapter.install(db, now_sql)

    def worker(self, proc) -> None:
        engine, args = self._process(proc, "worker")
        engine.work(proc.stop, args.poll)

    def sender(self, proc) -> None:
        engine, args = self._process(proc, "sender")
        sender = fresh("sender")
        sender.engine, sender.log = engine, QUIET
        sender.send(proc.stop, args.receiver_url, args.send_timeout, args.poll)

    def _process(self, proc, role: str) -> tuple[ModuleType, Any]:
        """This process's copy of the engine, configured from its command line."""
        from .__main__ import build_parser, configure
        argv = self.adapter.command(role, proc.context).argv
        args = build_parser().parse_args(argv[argv.index(role):])
        engine = fresh("engine")
        configure(args, engine)
        engine.WORKER = f"sim:{proc.pid}"
        engine.now = proc.now
        engine.random = proc.rng
        engine.threading = SimpleNamespace(Thread=proc.thread, Event=proc.event)
        engine.log = QUIET
        return engine, args
