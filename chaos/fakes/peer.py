"""Which process sent a request: the owner of the client's end of a loopback TCP connection.

A fake serves only 127.0.0.1, so both ends of every connection are on this machine (Linux):
the kernel finds the client's socket by its four addresses (a sock_diag netlink query, one
exact lookup; /proc/net/tcp, a walk over every socket, where netlink is refused), and the
process that holds it has that socket's inode among its file descriptors in /proc. This ties a call to its caller for an engine
whose requests name no worker (a plain client), without asking the engine for anything.

The answer is None when it cannot be known: not Linux, the caller already gone (a killed
worker's request still in flight), or its /proc entries not ours to read.
"""
from __future__ import annotations

import os
import socket
import struct
import threading

_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


class PeerFinder:
    """Finds the process behind a client address; remembers the processes it found, and
    looks among them first (a worker makes many calls), before reading every process."""

    def __init__(self) -> None:
        self._recent: list[int] = []
        self._lock = threading.Lock()

    def pid_of(self, client: tuple, server_port: int) -> int | None:
        """The pid holding the client end of the connection from `client` (host, port) to
        our `server_port`, or None."""
        inode = socket_inode(client[1], server_port)
        if inode is None:
            return None
        with self._lock:
            recent = list(self._recent)
        pid = holder(inode, recent) or holder(inode, _all_pids(), skip=set(recent))
        if pid is not None:
            with self._lock:
                if pid in self._recent:
                    self._recent.remove(pid)
                self._recent.insert(0, pid)
                del self._recent[64:]
        return pid


_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, _NLMSG_ERROR = 4, 20, 1, 2
_LOOPBACK = socket.inet_aton("127.0.0.1")


def socket_inode(local_port: int, remote_port: int) -> str | None:
    """The inode of the TCP socket 127.0.0.1:local_port -> 127.0.0.1:remote_port."""
    try:
        return _diag_inode(local_port, remote_port)
    except OSError:
        return _table_inode(local_port, remote_port)


def _diag_inode(local_port: int, remote_port: int) -> str | None:
    """Ask the kernel for the one socket (inet_diag_req_v2 with its whole id, not a dump;
    no cookie to match). Raises OSError where netlink is not to be had."""
    sockid = (struct.pack("!HH4s12x4s12x", local_port, remote_port, _LOOPBACK, _LOOPBACK)
              + struct.pack("=III", 0, 0xFFFFFFFF, 0xFFFFFFFF))
    request = struct.pack("=BBBxI", socket.AF_INET, socket.IPPROTO_TCP, 0, 0xFFFFFFFF) + sockid
    header = struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as link:
        link.settimeout(1.0)
        link.send(header + request)
        answer = link.recv(8192)
    if len(answer) < 16 or struct.unpack_from("=H", answer, 4)[0] == _NLMSG_ERROR:
        return None  # no such socket (the caller already closed it)
    inode = struct.unpack_from("=I", answer, 16 + 68)[0]  # inet_diag_msg.idiag_inode
    return str(inode) if inode else None


def _table_inode(local_port: int, remote_port: int) -> str | None:
    local, remote = f":{local_port:04X}", f":{remote_port:04X}"
    for table in _TABLES:
        try:
            with open(table) as rows:
                next(rows, None)
                for row in rows:
                    fields = row.split()
                    if len(fields) > 9 and fields[1].endswith(local) \
                            and fields[2].endswith(remote) and fields[9] != "0":
                        return fields[9]
        except OSError:
            continue
    return None


def holder(inode: str, pids, skip: set[int] = frozenset()) -> int | None:
    """The first of `pids` with the socket among its file descriptors."""
    target = f"socket:[{inode}]"
    for pid in pids:
        if pid in skip:
            continue
        fds = f"/proc/{pid}/fd"
        try:
            names = os.listdir(fds)
        except OSError:
            continue  # gone, or not ours to read
        for name in names:
            try:
                if os.readlink(f"{fds}/{name}") == target:
                    return pid
            except OSError:
                continue
    return None


def _all_pids() -> list[int]:
    # Newest first: the callers are the harness's children, started after most of the system.
    try:
        return sorted((int(p) for p in os.listdir("/proc") if p.isdigit()), reverse=True)
    except OSError:
        return []
