"""The fakes stamp a request when it reached the machine (the kernel's TCP_INFO), not when a
busy fake got round to it: on a loaded machine the gap is seconds, and a call stamped late
sat outside the lease its worker made it in."""
from __future__ import annotations

import socket
import threading
import time

from chaos.fakes.server import TICK, arrived


def test_a_request_read_late_is_stamped_when_its_bytes_arrived():
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        with client:
            client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
            sent = time.time()
            time.sleep(0.3)  # the fake, busy elsewhere, gets to the request this late
            conn, _ = server.accept()
            with conn:
                conn.recv(1024)
                now = time.time()
                stamped = arrived(conn, now)
    assert now - sent >= 0.3
    # never before the bytes came, and no later than a tick or two after
    assert sent - 0.001 <= stamped <= sent + 3 * TICK, (sent, stamped, now)


def test_a_request_read_at_once_keeps_the_handlers_time():
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        with client:
            conn, _ = server.accept()
            with conn:
                client.sendall(b"GET / HTTP/1.1\r\n\r\n")
                conn.recv(1024)
                now = time.time()
                assert arrived(conn, now) == now


def test_a_socket_without_tcp_info_keeps_the_handlers_time():
    left, right = socket.socketpair()  # a Unix socket: the kernel keeps no TCP_INFO for it
    with left, right:
        assert arrived(left, 12.5) == 12.5
