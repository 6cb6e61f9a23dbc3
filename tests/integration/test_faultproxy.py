"""The fault proxy of tests/support/faultproxy.py does what the network fault tests rely on,
checked against an echo server on loopback."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from tests.support.faultproxy import FaultProxy
from tests.support.wire import (
    AMQP,
    KAFKA,
    POSTGRES,
    Framer,
    amqp_publish,
    kafka_request,
    postgres_commit,
)

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


def test_a_commit_trigger_lets_the_server_commit_and_resets_before_the_answer(
    pg_dsn: str, pg_schema: str
) -> None:
    """psycopg's COMMIT reaches PostgreSQL, which commits; the client only sees a reset."""
    table = f'"{pg_schema}".cut'
    with psycopg.connect(pg_dsn, autocommit=True) as direct:
        direct.execute(f"CREATE TABLE {table} (n int)")
        with FaultProxy("127.0.0.1", 5432, POSTGRES) as proxy:
            trigger = proxy.arm(postgres_commit())
            dsn = f"postgresql://postgres@{proxy.address}/test?sslmode=disable"
            with psycopg.connect(dsn) as conn:
                conn.execute(f"INSERT INTO {table} VALUES (1)")
                with pytest.raises(psycopg.OperationalError):
                    conn.commit()
            assert trigger.fired == 1
            with psycopg.connect(dsn) as again:  # disarmed: commits as usual
                again.execute(f"INSERT INTO {table} VALUES (2)")
                again.commit()
            assert trigger.fired == 1
        rows = direct.execute(f"SELECT n FROM {table} ORDER BY n").fetchall()
    assert rows == [(1,), (2,)]


def chunked(framer: Framer, stream: bytes, size: int) -> list[bytes]:
    """The messages `framer` finds in `stream` fed `size` bytes at a time."""
    return [m for i in range(0, len(stream), size) for m in framer.feed(stream[i : i + size])]


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_the_wires_cut_a_stream_into_messages_however_it_is_chunked(size: int) -> None:
    commit = b"Q\x00\x00\x00\x0bCOMMIT\x00"
    startup = b"\x00\x00\x00\x08\x04\xd2\x16/" + b"\x00\x00\x00\x09\x00\x03\x00\x00\x00"
    messages = chunked(POSTGRES.up(), startup + b"Q\x00\x00\x00\nBEGIN\x00" + commit, size)
    assert len(messages) == 4 and messages[-1] == commit
    assert postgres_commit().request(commit)

    publish = b"\x01\x00\x01\x00\x00\x00\x08\x00\x3c\x00\x28\x00\x00\x01q\xce"
    assert chunked(AMQP.up(), b"AMQP\x00\x00\x09\x01" + publish * 2, size) == [publish] * 2
    assert amqp_publish("q").request(publish) and not amqp_publish("r").request(publish)

    produce = b"\x00\x00\x00\x0b" + b"\x00\x00\x00\x07\x00\x00\x00\x2a" + b"t42"
    answer = b"\x00\x00\x00\x06" + b"\x00\x00\x00\x2a" + b"ok"
    assert chunked(KAFKA.up(), produce * 2, size) == [produce] * 2
    assert KAFKA.down is not None and chunked(KAFKA.down(), answer, size) == [answer]
    trigger = kafka_request(0, "t42")
    assert trigger.request(produce) and not kafka_request(8, "t42").request(produce)
    assert trigger.answer is not None and trigger.answer(produce, answer)
