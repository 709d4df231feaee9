"""The lost-fsync journal: what a power cut would take back, kept beside a directory.

Every write, truncation and directory entry change is applied to the backing directory at
once (so every process reads what was written, as from the machine's page cache) and
logged with what it overwrote. An fsync or fdatasync of a file makes that file's logged
writes durable; an fsync of a directory makes the entries created, unlinked or renamed in
it durable. `drop` takes back what is not durable:

- "all": every unsynced write and entry, as when the page cache is lost whole;
- "torn-seq": a seeded subset of the unsynced writes survives, the rest is lost (LazyFS's
  torn-seq: the disk persisted some of a sequence of writes, in any order);
- "torn-op": every unsynced write is lost except one, chosen by the seed, of which only
  some 512-byte sectors reached the disk (LazyFS's torn-op).

Unsynced directory entries are always lost (create, unlink, rename not yet covered by an
fsync of their directory; a file's own fsync makes its creation durable, as on ext4). Modelled: file data per write call, sizes, entries in any
directory. Not modelled: metadata (mode, times), mkdir/rmdir (durable at once), hard links,
a disk reordering writes that an fsync did cover, and an fsync that lies.

Undo works backwards: every pending operation is undone newest first, then the surviving
writes are applied again oldest first. A file is tracked by an id bound to its inode (one
open descriptor per file), so writes follow it through renames and unlinks. Not thread
safe: the file system holds one lock around every call.
"""
from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass, field

MODES = ("all", "torn-seq", "torn-op")
SECTOR = 512


@dataclass
class Op:
    kind: str                 # write, truncate, create, unlink, rename
    fid: int
    durable: bool = False
    offset: int = 0
    data: bytes = b""
    old: bytes = b""          # the bytes the write or truncation replaced
    old_size: int = 0
    name: str = ""            # the entry (relative path); for rename, the old one
    new: str = ""             # rename's new entry
    replaced: int | None = None  # the file a rename replaced

    def dirs(self) -> set[str]:
        return {os.path.dirname(n) for n in (self.name, self.new) if n}


@dataclass
class Dropped:
    """What one drop took back."""

    writes: int = 0
    bytes: int = 0
    entries: int = 0
    kept_writes: int = 0
    torn_bytes_kept: int = 0
    files: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"dropped_writes": self.writes, "dropped_bytes": self.bytes,
                "dropped_entries": self.entries, "kept_writes": self.kept_writes,
                "torn_bytes_kept": self.torn_bytes_kept, "files": self.files}


class Journal:
    """The pending (unsynced) operations over the backing directory `root`; unlinked
    files wait in `stash` until their unlink is durable or dropped."""

    def __init__(self, root: str, stash: str) -> None:
        self.root, self.stash = root, stash
        os.makedirs(stash, exist_ok=True)
        self.ops: list[Op] = []
        self.names: dict[str, int] = {}   # entry -> file id
        self.fds: dict[int, int] = {}     # file id -> descriptor on its inode
        self._next = 0

    # -- paths and files ---------------------------------------------------------------------

    def real(self, name: str) -> str:
        return os.path.join(self.root, name.lstrip("/"))

    def _stashed(self, fid: int) -> str:
        return os.path.join(self.stash, str(fid))

    def fid(self, name: str) -> int:
        """The id of the file at entry `name` (relative), opening it on first use."""
        name = name.lstrip("/")
        if name not in self.names:
            fd = os.open(self.real(name), os.O_RDWR)
            self._next += 1
            self.names[name], self.fds[self._next] = self._next, fd
        return self.names[name]

    def fd(self, fid: int) -> int:
        return self.fds[fid]

    # -- operations (applied now, logged until synced) ---------------------------------------

    def write(self, fid: int, offset: int, data: bytes) -> int:
        fd = self.fds[fid]
        size = os.fstat(fd).st_size
        old = os.pread(fd, len(data), offset) if offset < size else b""
        written = os.pwrite(fd, data, offset)
        self.ops.append(Op("write", fid, offset=offset, data=bytes(data[:written]), old=old,
                           old_size=size))
        return written

    def truncate(self, fid: int, length: int) -> None:
        fd = self.fds[fid]
        size = os.fstat(fd).st_size
        old = os.pread(fd, size - length, length) if length < size else b""
        os.ftruncate(fd, length)
        self.ops.append(Op("truncate", fid, offset=length, old=old, old_size=size))

    def create(self, name: str, mode: int) -> int:
        name = name.lstrip("/")
        fd = os.open(self.real(name), os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        self._next += 1
        self.names[name], self.fds[self._next] = self._next, fd
        self.ops.append(Op("create", self._next, name=name))
        return self._next

    def unlink(self, name: str) -> None:
        name = name.lstrip("/")
        fid = self.fid(name)
        os.rename(self.real(name), self._stashed(fid))
        del self.names[name]
        self.ops.append(Op("unlink", fid, name=name))

    def rename(self, old: str, new: str) -> None:
        old, new = old.lstrip("/"), new.lstrip("/")
        fid = self.fid(old)
        replaced = self.fid(new) if os.path.isfile(self.real(new)) else None
        if replaced is not None:
            os.rename(self.real(new), self._stashed(replaced))
            del self.names[new]
        os.rename(self.real(old), self.real(new))
        del self.names[old]
        self.names[new] = fid
        self.ops.append(Op("rename", fid, name=old, new=new, replaced=replaced))

    def fsync(self, fid: int) -> None:
        """fsync or fdatasync of a file: its writes and truncations are durable, and so is
        the entry that created it, as ext4, XFS and btrfs make it (POSIX asks for an fsync
        of the directory too), with every earlier change of that entry's name (the unlink of
        a file it replaced: one name cannot hold both)."""
        os.fsync(self.fds[fid])
        for n, op in enumerate(self.ops):
            if op.fid == fid and op.kind in ("write", "truncate"):
                op.durable = True
            elif op.fid == fid and op.kind == "create" and not op.durable:
                for earlier in self.ops[:n + 1]:
                    if op.name in (earlier.name, earlier.new):
                        earlier.durable = True
        self._forget_durable()

    def fsyncdir(self, name: str) -> None:
        """fsync of a directory: the entries made or removed in it are durable."""
        name = name.strip("/")
        for op in self.ops:
            if op.kind in ("create", "unlink", "rename") and name in op.dirs():
                op.durable = True
        self._forget_durable()

    def _forget_durable(self) -> None:
        """Durable operations that no pending one precedes can never be undone: forget them
        (this keeps the log as short as the unsynced data)."""
        n = 0
        while n < len(self.ops) and self.ops[n].durable:
            n += 1
        if n:
            del self.ops[:n]

    def pending(self) -> dict:
        writes = [op for op in self.ops if op.kind == "write" and not op.durable]
        return {"writes": len(writes), "bytes": sum(len(op.data) for op in writes),
                "entries": sum(1 for op in self.ops
                               if op.kind in ("create", "unlink", "rename") and not op.durable)}

    # -- the cut -----------------------------------------------------------------------------

    def drop(self, mode: str = "all", seed: int = 0) -> Dropped:
        """Take back what is not durable (see the module's text for `mode`); afterwards the
        backing directory is what the disk held, and nothing is pending."""
        if mode not in MODES:
            raise ValueError(f"drop mode must be one of {MODES}, not {mode!r}")
        rng = random.Random(seed)
        pending = [op for op in self.ops if not op.durable]
        writes = [op for op in pending if op.kind == "write"]
        kept: dict[int, bytes | list[tuple[int, bytes]]] = {}  # id(op) -> data or sectors
        if mode == "torn-seq":
            kept = {id(op): op.data for op in writes if rng.random() < 0.5}
        elif mode == "torn-op" and writes:
            op = rng.choice(writes)
            sectors = [(o, op.data[o:o + SECTOR]) for o in range(0, len(op.data), SECTOR)]
            if len(sectors) > 1:  # some sectors, never all
                kept[id(op)] = sorted(rng.sample(sectors, rng.randrange(1, len(sectors))))
            else:  # one sector: its first part
                kept[id(op)] = [(0, op.data[:max(1, len(op.data) // 2)])]
        out = Dropped()
        for op in reversed(self.ops):
            if not op.durable:
                self._undo(op)
        for op in writes:
            part = kept.get(id(op))
            if part is None:
                out.writes, out.bytes = out.writes + 1, out.bytes + len(op.data)
                out.files.append(self._name_of(op.fid))
            elif isinstance(part, bytes):
                out.kept_writes += 1
                os.pwrite(self.fds[op.fid], part, op.offset)
            else:
                out.writes += 1
                for o, chunk in part:
                    os.pwrite(self.fds[op.fid], chunk, op.offset + o)
                    out.torn_bytes_kept += len(chunk)
                out.bytes += len(op.data) - sum(len(c) for _, c in part)
                out.files.append(self._name_of(op.fid))
        out.files = sorted(set(out.files))
        out.entries = sum(1 for op in pending if op.kind in ("create", "unlink", "rename"))
        self.reset()
        return out

    def _name_of(self, fid: int) -> str:
        return next((n for n, f in self.names.items() if f == fid), f"(unlinked file {fid})")

    def _undo(self, op: Op) -> None:
        if op.kind == "write":
            fd = self.fds[op.fid]
            if op.old:
                os.pwrite(fd, op.old, op.offset)
            if os.fstat(fd).st_size > op.old_size:
                os.ftruncate(fd, op.old_size)
        elif op.kind == "truncate":
            fd = self.fds[op.fid]
            os.ftruncate(fd, op.old_size)
            if op.old:
                os.pwrite(fd, op.old, op.offset)
        elif op.kind == "create":
            with _gone():
                os.unlink(self.real(op.name))
            self.names.pop(op.name, None)
        elif op.kind == "unlink":
            os.rename(self._stashed(op.fid), self.real(op.name))
            self.names[op.name] = op.fid
        elif op.kind == "rename":
            os.rename(self.real(op.new), self.real(op.name))
            self.names.pop(op.new, None)
            self.names[op.name] = op.fid
            if op.replaced is not None:
                os.rename(self._stashed(op.replaced), self.real(op.new))
                self.names[op.new] = op.replaced

    def reset(self) -> None:
        """Forget every operation and descriptor; empty the stash (what waits there was
        unlinked for good)."""
        self.ops.clear()
        self.close()
        shutil.rmtree(self.stash, ignore_errors=True)
        os.makedirs(self.stash, exist_ok=True)

    def close(self) -> None:
        for fd in self.fds.values():
            with _gone():
                os.close(fd)
        self.fds.clear()
        self.names.clear()


class _gone:
    """Ignore a file that is already gone."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        return kind is not None and issubclass(kind, (FileNotFoundError, OSError))
