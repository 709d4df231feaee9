"""The power_loss fault of a run: the machine under the store loses its power.

`store_mount` puts the run's store on a lost-fsync file system (the run folder's `store/`,
its disk in `powerloss/disk`; everything the harness records stays off it). `cut` is what
the nemesis does for one planned cut, holding the runner's reads and respawns back:

1. SIGKILL every engine process at once (workers and senders);
2. read the store as they left it: a copy of its files (the machine's page cache) is read
   with the adapter's `operations`: what the engine had acknowledged;
3. drop what no fsync covered (chaos.powerloss.journal: all, torn-seq or torn-op), and
   remount, which empties the kernel's caches of the old mount;
4. read the store again, and record `power_loss` with what was dropped (bytes, writes,
   entries), the acknowledged operations and those the cut lost, and whether the engine's
   settings promise durability (the adapter's `durability`, see chaos.contract).

The runner then respawns the processes and the run goes on. The SQLite store only: a
PostgreSQL server's data directory on the file system is not built yet, and is refused.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from collections import Counter
from typing import Any, Iterator

from .mount import Mount, unavailable

#: The drop modes a cut cycles through in "mixed" (the default), by the cut's pick.
CUT_MODES = ("all", "torn-seq", "torn-op")
#: What a power_loss event lists of the operations a cut lost (the count is whole).
LOST_LISTED = 20


def refusal(scenario: Any, backend: str = "sqlite") -> str | None:
    """Why this run cannot have its power_loss faults, or None (also when it has none)."""
    if not getattr(scenario.faults, "power_loss", 0):
        return None
    if backend != "sqlite":
        return ("faults.power_loss runs on the SQLite store only: a PostgreSQL data "
                "directory on the lost-fsync file system is not built yet")
    reason = unavailable()
    return f"faults.power_loss cannot run on this machine: {reason}" if reason else None


@contextlib.contextmanager
def store_mount(scenario: Any, run_dir: str) -> Iterator[Mount | None]:
    """The run's lost-fsync mount when its scenario plans power cuts, else None; always
    unmounted on the way out."""
    if not getattr(scenario.faults, "power_loss", 0):
        yield None
        return
    mount = Mount(os.path.join(run_dir, "powerloss"), os.path.join(run_dir, "store"),
                  log=os.path.join(run_dir, "powerloss", "fs.log"))
    with mount:
        yield mount


def durability(engine: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """The adapter's declaration for these settings: {"promised": bool | None,
    "setting": text}; promised None when the adapter declares nothing."""
    declare = getattr(engine, "durability", None)
    if declare is None:
        return {"promised": None, "setting": "not declared by the adapter"}
    promised, setting = declare(dict(settings))
    return {"promised": bool(promised), "setting": str(setting)}


def mode_of(scenario: Any, event: dict[str, Any]) -> str:
    mode = scenario.faults.power_loss_mode
    return CUT_MODES[event["pick"] % len(CUT_MODES)] if mode == "mixed" else mode


def cut(nemesis: Any, event: dict[str, Any]) -> None:
    """One power cut (see the module's text); `nemesis` holds the server and up locks."""
    mount: Mount = nemesis.store
    n = nemesis.applied["power_loss"] + 1
    with nemesis._server_lock, nemesis._up:
        started = time.time()
        victims = [c for c in nemesis.supervisor.alive() if c.role in ("worker", "sender")]
        for child in victims:
            nemesis.supervisor.signal(child, signal.SIGKILL)
        for child in victims:
            child.proc.wait()
        killed = time.time()
        before = _reading(nemesis.engine, nemesis.db, mount, n)
        mode = mode_of(nemesis.scenario, event)
        dropped = mount.cut(mode, seed=event["pick"])
        after = {_key(e) for e in nemesis.engine.operations(nemesis.db)}
        lost = [e for e in before if _key(e) not in after]
        nemesis.record({
            "t": killed, "src": "nemesis", "type": "power_loss", "cut": n, "mode": mode,
            "killed": [c.name for c in victims], "pids": [c.pid for c in victims],
            **dropped, "files": dropped["files"][:LOST_LISTED], "acknowledged": len(before), "lost_count": len(lost),
            "lost_by_type": dict(Counter(e.get("type") for e in lost)),
            "lost": [_brief(e) for e in lost[:LOST_LISTED]],
            "lost_jobs": len({e.get("job") for e in lost}),
            # whole, for what the cut cost beyond the store: a call billed again, an
            # effect whose sent mark is gone (bench/power_loss.py)
            "lost_memos": [list(x) for x in sorted({(e["job"], e["step"]) for e in lost
                                                    if e.get("type") == "memo"
                                                    and "step" in e})],
            "lost_sent": [list(x) for x in sorted({(e["job"], str(e.get("kind"))) for e in lost
                                                   if e.get("type") == "effect_sent"})],
            **{f"durability_{k}": v for k, v in
               durability(nemesis.engine, nemesis.scenario.engine).items()},
            "seconds": round(time.time() - started, 3)})
        nemesis._count("power_loss")


def _reading(engine: Any, db: str, mount: Mount, n: int) -> list[dict[str, Any]]:
    """The engine's operations as its store showed them just before the cut: its files as
    the killed processes left them, copied off the mount (a reading on the mount would
    close the last connection, whose checkpoint fsyncs what the cut must be able to
    drop), the wal-index left out (SQLite rebuilds it from the log)."""
    copy = os.path.join(mount.base, "cuts", str(n))
    os.makedirs(copy, exist_ok=True)
    for name in os.listdir(mount.mountpoint):
        if not name.endswith("-shm"):
            shutil.copyfile(os.path.join(mount.mountpoint, name), os.path.join(copy, name))
    try:
        return engine.operations(os.path.join(copy, os.path.basename(db)))
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def _key(e: dict[str, Any]) -> str:
    return json.dumps(e, sort_keys=True, default=str)


def _brief(e: dict[str, Any]) -> dict[str, Any]:
    return {k: e[k] for k in ("type", "t", "job", "step", "from", "to", "kind", "key", "op",
                              "worker") if e.get(k) is not None}
