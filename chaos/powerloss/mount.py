"""Mounting the lost-fsync file system (chaos.powerloss.fs) and talking to it.

`Mount` starts the file system as a child process of the harness, waits until the kernel
shows the mount, sends it control requests, and unmounts it however the run ends: `close`
unmounts (lazily if something still holds a file) and ends the process; the child itself
unmounts when the harness dies (see chaos.powerloss.fs).

`unavailable()` says why this machine cannot mount one (no /dev/fuse, no fusermount3, no
libfuse3), or None; a scenario with a power_loss fault is refused with that reason before
anything starts. NINELIVES_FUSERMOUNT names the fusermount3 program to use (a path that
does not exist makes the machine one that cannot mount, which is how that refusal is
tested).
"""
from __future__ import annotations

import ctypes.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from typing import Any


FUSERMOUNT_ENV = "NINELIVES_FUSERMOUNT"
MOUNT_WAIT = 15.0


class MountError(RuntimeError):
    """The file system could not be mounted, answered an error, or did not unmount."""


def fusermount() -> str:
    return os.environ.get(FUSERMOUNT_ENV) or "fusermount3"


def unavailable() -> str | None:
    """Why a lost-fsync file system cannot be mounted here, or None when it can."""
    program = fusermount()
    if not (shutil.which(program) if os.sep not in program else os.access(program, os.X_OK)):
        hint = f" ({FUSERMOUNT_ENV}={program})" if os.environ.get(FUSERMOUNT_ENV) else \
            " (install the fuse3 package)"
        return f"no fusermount3 program{hint}"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine (a container needs --device /dev/fuse)"
    if not ctypes.util.find_library("fuse3"):
        return "no libfuse3 library (install the fuse3 package)"
    try:
        import mfusepy  # noqa: F401  (loads libfuse through ctypes)
    except (ImportError, OSError) as exc:
        return f"the FUSE binding mfusepy cannot load: {exc}"
    return None


def mounted(path: str) -> bool:
    """Whether a file system is mounted at `path` (from the kernel's table: a cut file
    system answers EIO to the stat that os.path.ismount makes)."""
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo", encoding="utf-8") as table:
        return any(line.split()[4].replace("\\040", " ") == path for line in table)


class Mount:
    """One lost-fsync mount of `base`/disk at `mountpoint`; a context manager."""

    def __init__(self, base: str, mountpoint: str, log: str | None = None, *,
                 shared: bool = False) -> None:
        self.base, self.mountpoint, self.log = base, mountpoint, log
        # shared: other users may use the mount too (FUSE's allow_other; root may always
        # ask for it): a PostgreSQL server runs as its own user (chaos.run.pgserver)
        self.shared = shared
        # an abstract socket (Linux): no path to outgrow 108 bytes, no file to remove
        self.control = f"ninelives-powerloss-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.proc: subprocess.Popen | None = None
        os.makedirs(os.path.join(base, "disk"), exist_ok=True)
        os.makedirs(mountpoint, exist_ok=True)

    # -- mounting ----------------------------------------------------------------------------

    def start(self) -> "Mount":
        reason = unavailable()
        if reason:
            raise MountError(f"cannot mount the lost-fsync file system: {reason}")
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL
        try:
            # not start_owned: its parent-death signal is bound to the starting thread
            # (see chaos.powerloss.fs, which watches its parent itself)
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "chaos.powerloss.fs", self.base, self.mountpoint,
                 self.control, str(os.getpid()), fusermount(),
                 "allow_other" if self.shared else ""],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        finally:
            if self.log:
                out.close()
        deadline = time.monotonic() + MOUNT_WAIT
        while not (mounted(self.mountpoint) and self._answers()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise MountError(f"the lost-fsync file system did not mount at "
                                 f"{self.mountpoint} (its log: {self.log})")
            time.sleep(0.02)
        return self

    def _answers(self) -> bool:
        try:
            self.request({"cmd": "ping"}, timeout=5.0)
            return True
        except OSError:  # not listening yet
            return False

    def stop(self) -> None:
        """Unmount and end the file system's process; idempotent."""
        if mounted(self.mountpoint):
            done = subprocess.run([fusermount(), "-u", self.mountpoint], capture_output=True,
                                  check=False)
            if done.returncode and mounted(self.mountpoint):
                subprocess.run([fusermount(), "-u", "-z", self.mountpoint],
                               capture_output=True, check=False)
        if self.proc is not None:
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(3)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None
        if mounted(self.mountpoint):
            raise MountError(f"{self.mountpoint} is still mounted")

    def __enter__(self) -> "Mount":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- control -----------------------------------------------------------------------------

    def request(self, request: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect("\0" + self.control)
            sock.sendall((json.dumps(request) + "\n").encode())
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                reply += chunk
        answer = json.loads(reply or b"{}")
        if not answer.get("ok"):
            raise MountError(f"the lost-fsync file system refused {request.get('cmd')!r}: "
                             f"{answer.get('error', 'no answer')}")
        answer.pop("ok")
        return answer

    def pending(self) -> dict[str, Any]:
        return self.request({"cmd": "pending"})

    def cut(self, mode: str = "all", seed: int = 0) -> dict[str, Any]:
        """The power cut: drop what is not durable, then remount (the kernel's caches of the
        old mount go with it). Every process using the mount must be dead already."""
        dropped = self.request({"cmd": "drop", "mode": mode, "seed": seed})
        self.stop()
        self.start()
        return dropped
