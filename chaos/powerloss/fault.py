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

The runner then respawns the processes and the run goes on.

On PostgreSQL (a server the run started, chaos.run.pgserver) the server's data directory is
copied onto the file system's disk before the mount and the server runs durable there (fsync
and full_page_writes on), and the server is part of the machine: before step 1 the engine's
processes and the server's WAL writer are stopped (SIGSTOP) and the live server is read
(what it acknowledged, commits still in its WAL buffers included); step 1 then SIGKILLs the
postmaster and every process it started with the engine's; after step 3 the server starts
again on the mount and recovers from what the cut left of its WAL. A server named by
--pg-url is refused: the harness cannot cut the power of a machine it does not own.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

from chaos.powerloss.mount import Mount, unavailable

#: The drop modes a cut cycles through in "mixed" (the default), by the cut's pick.
CUT_MODES = ("all", "torn-seq", "torn-op")
#: What a power_loss event lists of the operations a cut lost (the count is whole).
LOST_LISTED = 20


def refusal(scenario: Any, backend: str = "sqlite", *, own_server: bool = True) -> str | None:
    """Why this run cannot have its power_loss faults, or None (also when it has none).
    own_server: on postgres, whether the run starts its server itself (no --pg-url)."""
    if not getattr(scenario.faults, "power_loss", 0):
        return None
    if backend != "sqlite" and not own_server:
        return ("faults.power_loss needs --backend postgres on a server the run starts "
                "itself (without --pg-url): the harness cuts the power of the server's "
                "machine, and cannot cut a server it does not own")
    reason = unavailable()
    return f"faults.power_loss cannot run on this machine: {reason}" if reason else None


@contextlib.contextmanager
def store_mount(scenario: Any, run_dir: str, server: Any = None) -> Iterator[Mount | None]:
    """The run's lost-fsync mount when its scenario plans power cuts, else None; always
    unmounted on the way out. `server`: the PostgreSQL server the run started
    (chaos.run.pgserver), moved onto the mount, and stopped before the unmount."""
    if not getattr(scenario.faults, "power_loss", 0):
        yield None
        return
    base = os.path.join(run_dir, "powerloss")
    if server is None:
        with Mount(base, os.path.join(run_dir, "store"),
                   log=os.path.join(base, "fs.log")) as mount:
            yield mount
        return
    # the server runs as its own user: its mount point where that user can reach it
    mountpoint = tempfile.mkdtemp(prefix=f"ninelives-powerloss-{os.path.basename(run_dir)}-")
    os.chmod(mountpoint, 0o755)
    try:
        # copied to the disk before the mount: the cluster itself survives every cut
        server.move_to(Path(base) / "disk" / "data")
        with Mount(base, mountpoint, log=os.path.join(base, "fs.log"), shared=True) as mount:
            try:
                server.run_at(Path(mountpoint) / "data")
                yield mount
            finally:
                server.stop()  # no process may hold the mount at its unmount
    finally:
        os.rmdir(mountpoint)
        # the cluster's files (tens of MB) are no evidence: the history holds the readings
        shutil.rmtree(os.path.join(base, "disk", "data"), ignore_errors=True)
        shutil.rmtree(os.path.join(base, "stash"), ignore_errors=True)


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
        server = nemesis.server  # the PostgreSQL server on the mount, or None (SQLite)
        victims = [c for c in nemesis.supervisor.alive() if c.role in ("worker", "sender")]
        before = _server_reading(nemesis, victims) if server is not None else None
        for child in victims:
            nemesis.supervisor.signal(child, signal.SIGKILL)
        server_pids = server.kill() if server is not None else []
        for child in victims:
            child.proc.wait()
        killed = time.time()
        if before is None:
            before = _reading(nemesis.engine, nemesis.db, mount, n)
        mode = mode_of(nemesis.scenario, event)
        dropped = mount.cut(mode, seed=event["pick"])
        recovered = None
        if server is not None:
            server.restart()  # crash recovery from what the cut left of its WAL
            recovered = round(time.time() - killed, 3)
        after = {_key(e) for e in nemesis.engine.operations(nemesis.db)}
        lost = [e for e in before if _key(e) not in after]
        nemesis.record({
            "t": killed, "src": "nemesis", "type": "power_loss", "cut": n, "mode": mode,
            "killed": [c.name for c in victims] + (["server"] if server is not None else []),
            "pids": [c.pid for c in victims], "server_pids": server_pids,
            **({"server_up_after": recovered} if recovered is not None else {}),
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
            # a claim gone: the calls made under it are no longer the store's (fenced-writes)
            "lost_claims": [list(x) for x in sorted({(e["job"], str(e.get("worker")))
                                                     for e in lost
                                                     if e.get("type") == "claimed"})],
            **{f"durability_{k}": v for k, v in
               durability(nemesis.engine, nemesis.scenario.engine).items()},
            "read_seconds": round(killed - started, 3), "seconds": round(time.time() - started, 3)})
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


def _server_reading(nemesis: Any, victims: list[Any]) -> list[dict[str, Any]]:
    """The engine's operations as the PostgreSQL server acknowledged them just before the
    cut: its clients stopped (SIGSTOP: no new commit) and its WAL writer too (no commit made
    durable meanwhile), the live server is read. Read after the kill, from its files, it
    would not show the commits still in its WAL buffers, acknowledged under
    synchronous_commit=off; started again to be read, it would checkpoint them."""
    for child in victims:
        nemesis.supervisor.signal(child, signal.SIGSTOP)
    writer = nemesis.server.stop_wal_writer()
    try:
        return nemesis.engine.operations(nemesis.db)
    except BaseException:  # no cut then: everything runs on as it was
        for child in victims:
            nemesis.supervisor.signal(child, signal.SIGCONT)
        if writer is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(writer, signal.SIGCONT)
        raise


def _key(e: dict[str, Any]) -> str:
    return json.dumps(e, sort_keys=True, default=str)


def _brief(e: dict[str, Any]) -> dict[str, Any]:
    return {k: e[k] for k in ("type", "t", "job", "step", "from", "to", "kind", "key", "op",
                              "worker") if e.get(k) is not None}
