"""The lost-fsync file system: a FUSE pass-through over a backing directory whose unsynced
writes a power cut can take back (chaos.powerloss.journal keeps them).

Run as its own process, a child of the harness (`python -m chaos.powerloss.fs BASE MOUNT
NAME PARENT [FUSERMOUNT [allow_other]]`): BASE/disk is what the mount shows, BASE/stash holds unlinked files until
the cut decides. It answers on the abstract Unix socket NAME, one JSON line per request:
`{"cmd": "pending"}`, `{"cmd": "drop", "mode": ..., "seed": ...}`, `{"cmd": "ping"}`.

It never outlives the harness: a watcher thread unmounts it (lazily) once its parent is
gone, and the loop then ends. Not PR_SET_PDEATHSIG: that fires when the *thread* that
started the process ends, and a cut remounts from the nemesis's thread, which ends at the
heal while the store must stay mounted. The binding is mfusepy: it reaches libfuse3 through ctypes, so nothing is
compiled and the only system package needed is fuse3 (pyfuse3 would need libfuse3-dev, a
compiler and trio).
"""
from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import mfusepy
from mfusepy import FuseOSError

from chaos.powerloss.journal import Journal


#: The errors a file system answers every day (a lookup of a name that does not exist):
#: not worth a line in its log.
QUIET = (errno.ENOENT, errno.EEXIST, errno.ENOTEMPTY)


def _oserror(fn):
    """Turn an OSError of the backing directory into the errno FUSE answers."""
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            if args[0].down:
                raise OSError(errno.EIO, "the power is cut")
            return fn(*args, **kwargs)
        except OSError as exc:
            if exc.errno not in QUIET:
                print(f"{fn.__name__}{args[1:2]}: {exc}", file=sys.stderr, flush=True)
            raise FuseOSError(exc.errno or errno.EIO) from None
        except KeyError as exc:  # a handle from before the cut
            print(f"{fn.__name__}{args[1:2]}: no handle {exc}", file=sys.stderr, flush=True)
            raise FuseOSError(errno.EIO) from None
    wrapped.__name__ = fn.__name__
    return wrapped


class LostFsync(mfusepy.Operations):
    """File operations over the journal, one lock around all (FUSE runs single-threaded;
    the control socket is the other thread)."""

    use_ns = True

    def __init__(self, journal: Journal) -> None:
        self.j = journal
        self.mutex = threading.Lock()
        self.down = False  # after a drop, until the remount: every operation fails

    def _real(self, path: str) -> str:
        return self.j.real(path)

    @_oserror
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        st = os.lstat(self._real(path))
        return {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid",
                                            "st_size", "st_atime_ns", "st_mtime_ns",
                                            "st_ctime_ns", "st_ino")} | {
            "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns}

    @_oserror
    def readdir(self, path: str, fh: int):
        return [".", ".."] + os.listdir(self._real(path))

    @_oserror
    def access(self, path: str, amode: int) -> int:
        if not os.access(self._real(path), amode):
            raise FuseOSError(errno.EACCES)
        return 0

    @_oserror
    def statfs(self, path: str) -> dict[str, int]:
        sv = os.statvfs(self._real(path))
        return {k: getattr(sv, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize",
                                            "f_favail", "f_ffree", "f_files", "f_flag",
                                            "f_frsize", "f_namemax")}

    @_oserror
    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._real(path), mode)
        return 0

    @_oserror
    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._real(path), uid, gid)
        return 0

    @_oserror
    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        os.utime(self._real(path), ns=times) if times else os.utime(self._real(path))
        return 0

    @_oserror
    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._real(path), mode)
        return 0

    @_oserror
    def rmdir(self, path: str) -> int:
        os.rmdir(self._real(path))
        return 0

    @_oserror
    def open(self, path: str, flags: int) -> int:
        with self.mutex:
            fid = self.j.fid(path)
            if flags & os.O_TRUNC:
                self.j.truncate(fid, 0)
            return fid

    @_oserror
    def create(self, path: str, mode: int, fi: Any = None) -> int:
        with self.mutex:
            return self.j.create(path, mode)

    @_oserror
    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        with self.mutex:
            return os.pread(self.j.fd(fh), size, offset)

    @_oserror
    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        with self.mutex:
            return self.j.write(fh, offset, data)

    @_oserror
    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        with self.mutex:
            self.j.truncate(fh if fh else self.j.fid(path), length)
        return 0

    @_oserror
    def fsync(self, path: str, datasync: int, fh: int) -> int:
        with self.mutex:
            self.j.fsync(fh)
        return 0

    @_oserror
    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        with self.mutex:
            self.j.fsyncdir(path)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0  # close() is no fsync: nothing becomes durable here

    def release(self, path: str, fh: int) -> int:
        return 0  # the descriptor stays with the journal until the cut

    @_oserror
    def unlink(self, path: str) -> int:
        with self.mutex:
            self.j.unlink(path)
        return 0

    @_oserror
    def rename(self, old: str, new: str) -> int:
        with self.mutex:
            self.j.rename(old, new)
        return 0

    def answer(self, request: dict) -> dict:
        """One control request (see the module's text)."""
        cmd = request.get("cmd")
        with self.mutex:
            if cmd == "ping":
                return {"ok": True}
            if cmd == "pending":
                return {"ok": True, **self.j.pending()}
            if cmd == "drop":
                self.down = True
                return {"ok": True, **self.j.drop(request.get("mode", "all"),
                                                  int(request.get("seed", 0))).to_json()}
        return {"ok": False, "error": f"unknown command {cmd!r}"}


def serve_control(ops: LostFsync, path: str) -> socket.socket:
    """Answer control requests on the abstract Unix socket named `path` from a thread of
    its own."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("\0" + path)
    server.listen(4)

    def loop() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return  # closed: the file system is going
            with conn, conn.makefile("rw", encoding="utf-8") as stream:
                for line in stream:
                    try:
                        reply = ops.answer(json.loads(line))
                    except Exception as exc:  # a bad request, or a drop that failed
                        reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                    stream.write(json.dumps(reply) + "\n")
                    stream.flush()

    threading.Thread(target=loop, name="powerloss-control", daemon=True).start()
    return server


def watch_parent(parent: int, mount: str, fusermount: str) -> None:
    """Unmount (lazily) once `parent` is gone, in case the SIGTERM of its death was lost."""
    def loop() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        subprocess.run([fusermount, "-u", "-z", mount], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
    threading.Thread(target=loop, name="powerloss-parent", daemon=True).start()


def main(argv: list[str]) -> int:
    base, mount, control, parent = argv[0], argv[1], argv[2], int(argv[3])
    fusermount = argv[4] if len(argv) > 4 else "fusermount3"
    shared = {"allow_other": True} if argv[5:6] == ["allow_other"] else {}
    if os.getppid() != parent:
        return 1
    journal = Journal(os.path.join(base, "disk"), os.path.join(base, "stash"))
    ops = LostFsync(journal)
    server = serve_control(ops, control)
    watch_parent(parent, mount, fusermount)
    try:
        # kernel_cache: an open() must not flush the kernel's cache of a file that others
        # map (SQLite's wal-index is shared memory; flushed under a mapping, a write to it
        # is lost); nothing else writes the backing files while mounted. hard_remove: an
        # unlinked open file is unlinked (the journal keeps it), not renamed to .fuse_hidden.
        mfusepy.FUSE(ops, mount, foreground=True, nothreads=True, fsname="ninelives-powerloss",
                     kernel_cache=True, hard_remove=True, **shared)
    except RuntimeError:
        pass  # libfuse's own unmount failed: fusermount3 -u had unmounted it already
    finally:
        server.close()
        journal.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
