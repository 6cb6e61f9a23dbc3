"""The fault proxy of tests/support/faultproxy.py does what the network fault tests rely on,
checked against an echo server on loopback."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.faultproxy import FaultProxy

pytestmark = pytest.mark.integration


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.server.received.append(data)  # type: ignore[attr-defined]
            self.request.sendall(data)


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    server.received = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with FaultProxy("127.0.0.1", server.server_address[1]) as p:
        p.echo = server  # type: ignore[attr-defined]
        yield p
    server.shutdown()
    server.server_close()


def connect(proxy: FaultProxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    sock.sendall(b"hello")
    assert sock.recv(100) == b"hello"
    return sock


def silent(sock: socket.socket, seconds: float = 1.0) -> bool:
    """Nothing arrives for `seconds`, and the connection is not closed (no FIN, no RST)."""
    sock.settimeout(seconds)
    try:
        sock.recv(100)
    except TimeoutError:
        return True
    return False


def test_a_blackhole_holds_both_directions_open_and_silent_until_healed(
    proxy: FaultProxy,
) -> None:
    with connect(proxy) as sock:
        proxy.blackhole()
        sock.sendall(b"held")
        assert silent(sock)
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as late:  # accepted
            late.sendall(b"late")
            assert silent(late)
            assert b"held" not in proxy.echo.received  # type: ignore[attr-defined]
            proxy.heal()
            sock.settimeout(5)
            late.settimeout(5)
            assert sock.recv(100) == b"held"  # delayed, never lost
            assert late.recv(100) == b"late"


def test_a_cut_stops_one_direction_only(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        proxy.cut("down")
        sock.sendall(b"up")
        deadline = time.monotonic() + 5
        while b"up" not in proxy.echo.received:  # type: ignore[attr-defined]
            assert time.monotonic() < deadline, "the up direction must still flow"
            time.sleep(0.05)
        assert silent(sock)
        proxy.heal()
        proxy.cut("up")
        sock.sendall(b"more")
        sock.settimeout(5)
        assert sock.recv(100) == b"up"  # the echo held downstream comes now
        assert silent(sock)
        assert b"more" not in proxy.echo.received  # type: ignore[attr-defined]


def test_a_reset_resets(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        proxy.reset()
        sock.settimeout(5)
        with pytest.raises(ConnectionResetError):
            sock.recv(100)
    connect(proxy).close()  # new connections are forwarded as before


def test_latency_delays_each_way(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        proxy.latency(0.3)
        time.sleep(0.1)  # the setting reaches the proxy's loop
        started = time.monotonic()
        sock.sendall(b"slow")
        sock.settimeout(5)
        assert sock.recv(100) == b"slow"
        assert time.monotonic() - started >= 0.6
