"""The lost-fsync file system mounted for real (FUSE): a cut takes back what was not
fsynced, SQLite keeps every commit with synchronous=FULL and loses some with OFF, a machine
that cannot mount is named, and no mount outlives a SIGKILLed harness. These never skip:
`make test` installs fuse3."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from chaos.powerloss import mount as pl


@pytest.fixture
def fs(tmp_path):
    with pl.Mount(str(tmp_path / "fs"), str(tmp_path / "mnt"), log=str(tmp_path / "fs.log")) as m:
        yield m
    assert not pl.mounted(str(tmp_path / "mnt"))


def test_the_machine_can_mount_one():
    assert pl.unavailable() is None


def test_unsynced_data_and_entries_are_dropped_synced_ones_kept(fs):
    mnt = fs.mountpoint
    with open(os.path.join(mnt, "kept"), "wb") as f:
        f.write(b"synced")
        f.flush()
        os.fsync(f.fileno())
    d = os.open(mnt, os.O_RDONLY)
    os.fsync(d)  # the entries of "kept" are durable from here
    with open(os.path.join(mnt, "kept"), "ab") as f:
        f.write(b"+lost")
    with open(os.path.join(mnt, "new"), "wb") as f:
        f.write(b"never synced")
    os.rename(os.path.join(mnt, "kept"), os.path.join(mnt, "renamed"))
    os.close(d)
    assert fs.pending() == {"writes": 2, "bytes": 17, "entries": 2}
    dropped = fs.cut()
    assert (dropped["dropped_writes"], dropped["dropped_bytes"], dropped["dropped_entries"]) \
        == (2, 17, 2)
    assert sorted(os.listdir(mnt)) == ["kept"]
    with open(os.path.join(mnt, "kept"), "rb") as f:
        assert f.read() == b"synced"


COMMITS = textwrap.dedent("""
    import os, sqlite3, sys
    db, sync, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={sync}")
    conn.execute("CREATE TABLE IF NOT EXISTS t (x)")
    for i in range(n):
        conn.execute("INSERT INTO t VALUES (?)", (i,))
        print(i, flush=True)   # acknowledged
    os.kill(os.getpid(), 9)    # the cut finds it dead, its connection never closed
""")


def rows(db: str) -> int:
    out = subprocess.run([sys.executable, "-c", "import sqlite3, sys\n"
                          "c = sqlite3.connect(sys.argv[1])\n"
                          "try: print(c.execute('SELECT count(*) FROM t').fetchone()[0])\n"
                          "except sqlite3.OperationalError: print(0)\n"
                          "print(c.execute('PRAGMA integrity_check').fetchone()[0])", db],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[1] == "ok"
    return int(out[0])


@pytest.mark.parametrize("sync", ["FULL", "OFF"])
def test_sqlite_full_keeps_every_commit_over_cuts_off_loses_some(fs, sync):
    db = os.path.join(fs.mountpoint, "store.db")
    acknowledged, lost = 0, 0
    for cut in range(3):
        done = subprocess.run([sys.executable, "-c", COMMITS, db, sync, "40"],
                              capture_output=True, text=True)
        acknowledged += len(done.stdout.split())
        fs.cut(mode=("all", "torn-seq", "torn-op")[cut], seed=cut)
        lost = acknowledged - rows(db)
    if sync == "FULL":
        assert lost == 0
    else:
        assert lost > 0


def test_a_machine_without_fusermount_is_named_and_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(pl.FUSERMOUNT_ENV, str(tmp_path / "no-such-fusermount3"))
    reason = pl.unavailable()
    assert reason and "no fusermount3 program" in reason and "no-such-fusermount3" in reason
    with pytest.raises(pl.MountError, match="no fusermount3"):
        pl.Mount(str(tmp_path / "fs"), str(tmp_path / "mnt")).start()
    assert not pl.mounted(str(tmp_path / "mnt"))


def test_no_mount_outlives_a_sigkilled_harness(tmp_path):
    mnt = tmp_path / "mnt"
    harness = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom chaos.powerloss.mount import Mount\n"
         "Mount(sys.argv[1], sys.argv[2]).start()\nprint('up', flush=True)\ntime.sleep(60)",
         str(tmp_path / "fs"), str(mnt)], stdout=subprocess.PIPE, text=True)
    try:
        assert harness.stdout.readline().strip() == "up"
        assert pl.mounted(str(mnt))
    finally:
        harness.send_signal(signal.SIGKILL)
        harness.wait()
        harness.stdout.close()
    deadline = time.monotonic() + 10
    while pl.mounted(str(mnt)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pl.mounted(str(mnt))
    def left() -> list[str]:  # the file system's process, gone after its unmount
        return subprocess.run(["pgrep", "-f", f"chaos.powerloss.fs {tmp_path}"],
                              capture_output=True, text=True).stdout.split()
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left()
