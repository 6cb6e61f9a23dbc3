"""Network faults on loopback: a `bridge run` talks to RabbitMQ or PostgreSQL through a fault
proxy (tests/support/faultproxy.py) that the test turns into a blackhole for BLACKHOLE seconds
while messages keep coming: nothing forwarded, nothing closed (no RST, no FIN), the stall that
only the bridge's own timeouts can notice (the proxy's kernel acknowledges everything, so TCP
keepalives never fire).

Each case proves, on a real process: the route notices within its configured timeouts
(`/readyz` turns 503), stays not ready for the rest of the outage, is ready again and moving
within RECOVERY seconds of the network coming back, and loses nothing (the fault table of
tests/faults.py, whose case names carry the measured times).
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import pika
import pytest

from bridge.config.loader import load_config
from bridge.envelope import Envelope, Headers
from bridge.protocols import Transport
from bridge.transports import load
from bridge.transports.sql.chain import CHAIN
from bridge.transports.sql.config import PostgresConnection
from tests.conftest import unique
from tests.faults import BridgeProcess, report
from tests.support.faultproxy import FaultProxy
from tests.support.localkafka import free_port
from tests.support.queues import drain

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BATCH = 50
#: Seconds the network is gone: longer than every timeout the configs below set.
BLACKHOLE = 20.0
#: Seconds from the network's return to a ready route that moves messages again.
RECOVERY = 30.0
#: The AMQP heartbeat asked for in the RabbitMQ URL: pika closes a connection that received
#: nothing for a whole check interval of HEARTBEAT + 5 seconds (pika/heartbeat.py), so it is
#: noticed 7 to 14 seconds after it fell silent.
HEARTBEAT = 2
RABBIT_NOTICE = 2 * (HEARTBEAT + 5)
#: PostgreSQL's `response_timeout` in the config; the watchdog looks twice a second.
RESPONSE_TIMEOUT = 4.0
PG_NOTICE = RESPONSE_TIMEOUT + 0.5
#: What the test itself adds to a measured time: polling /readyz, a log line, a scheduler.
SLACK = 3.0


def readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:  # not listening yet
        return 0


class Producer:
    """Sends 20 messages every 0.1 s into a queue the route reads, until stopped: traffic
    that keeps coming through the outage, so it always comes mid-stream."""

    def __init__(self, transport: Transport, queue: str) -> None:
        self.sent: set[str] = set()
        self._sink = transport.sink(queue)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            ids = [f"m{n + i}" for i in range(20)]
            n += 20
            await self._sink.send(
                [Envelope(Headers([("NServiceBus.MessageId", i)]), b"x" * 100) for i in ids]
            )
            self.sent.update(ids)
            await asyncio.sleep(0.1)

    async def stop(self) -> set[str]:
        self._stop.set()
        assert self._task is not None
        await self._task
        await self._sink.close()
        return self.sent


async def until(condition: Callable[[], Awaitable[bool]], timeout: float, what: str) -> float:
    """Seconds until `condition()` holds; fails after `timeout`."""
    start = time.monotonic()
    while not await condition():
        assert time.monotonic() - start < timeout, f"{what}: not within {timeout:g} s"
        await asyncio.sleep(0.1)
    return time.monotonic() - start


async def blackhole_mid_stream(
    bridge: BridgeProcess,
    proxy: FaultProxy,
    http_port: int,
    delivered: Callable[[], Awaitable[int]],
    notice: float,
) -> tuple[float, float]:
    """With the bridge moving messages, blackhole the proxy for BLACKHOLE seconds; (seconds
    until /readyz said not ready, seconds from the heal to ready and moving again)."""

    async def ready() -> bool:
        return await asyncio.to_thread(readyz, http_port) == 200

    async def not_ready() -> bool:
        assert bridge.running, bridge.output()
        return await asyncio.to_thread(readyz, http_port) == 503

    await until(ready, 60, "ready at start")
    await until(lambda: _more_than(delivered, 0), 60, "moving at start")
    proxy.blackhole()
    started = time.monotonic()
    noticed = await until(not_ready, notice + SLACK, "the outage noticed")
    await asyncio.sleep(max(0.0, started + BLACKHOLE - time.monotonic()))
    assert bridge.running, bridge.output()
    assert await asyncio.to_thread(readyz, http_port) == 503, "ready during the outage"
    before = await delivered()
    proxy.heal()
    healed = time.monotonic()
    await until(ready, RECOVERY, "ready again")
    await until(lambda: _more_than(delivered, before), RECOVERY, "moving again")
    return noticed, time.monotonic() - healed


async def _more_than(count: Callable[[], Awaitable[int]], n: int) -> bool:
    return await count() > n


def write_config(path: Path, http_port: int, connections: list[str], ends: list[str]) -> Path:
    """routes.yaml with /readyz on `http_port`, `connections` (one YAML line each) and the
    route `net` (its `from` and `to` lines)."""
    lines = [f"http: {{host: 127.0.0.1, port: {http_port}}}", "connections:"]
    lines += [f"  {line}" for line in connections]
    lines += ["routes:", "  - name: net", *(f"    {line}" for line in ends)]
    lines.append(f"    batch_size: {BATCH}")
    path.write_text("\n".join(lines) + "\n")
    return path


def run_to_end(config: Path, *args: str) -> None:
    with BridgeProcess(config, *args).start() as bridge:
        code = bridge.wait()
    assert code == 0, bridge.output()


def rabbit_ids(url: str, queue: str) -> list[str]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    got = []
    while True:
        method, properties, _ = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append(properties.message_id)
    channel.queue_delete(queue)
    channel.exchange_delete(queue)
    connection.close()
    return got


def rabbit_depth(url: str, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    depth = connection.channel().queue_declare(queue, passive=True).method.message_count
    connection.close()
    return int(depth)


async def test_sqlite_to_rabbitmq_through_a_blackhole(tmp_path: Path, rabbitmq_url: str) -> None:
    """The sink's connection falls silent mid-publish: the heartbeat closes it (the confirms
    of the publish would wait CONFIRM_TIMEOUT, 120 s), the SQLite transaction rolls back, and
    the connection is opened anew once the network is back."""
    queue, src = unique("net"), unique("Src")
    http_port = free_port()
    with FaultProxy("127.0.0.1", 5672) as proxy:
        url = f"amqp://guest:guest@{proxy.address}/%2F?heartbeat={HEARTBEAT}"
        config = write_config(
            tmp_path / "routes.yaml",
            http_port,
            [
                f'lite: {{type: sqlite, path: "{tmp_path / "q.db"}"}}',
                f'rabbit: {{type: rabbitmq, url: "{url}",'
                ' management_url: "http://guest:guest@127.0.0.1:15672"}',
            ],
            [
                f"from: {{connection: lite, queue: {src}}}",
                f"to: {{connection: rabbit, queue: {queue}}}",
            ],
        )
        await asyncio.to_thread(run_to_end, config, "install")
        lite = load("lite", load_config(config).config.connections["lite"])
        producer = Producer(lite, src)

        async def delivered() -> int:
            return await asyncio.to_thread(rabbit_depth, rabbitmq_url, queue)

        try:
            with BridgeProcess(config, "run").start() as bridge:
                producer.start()
                noticed, recovered = await blackhole_mid_stream(
                    bridge, proxy, http_port, delivered, RABBIT_NOTICE
                )
                sent = await producer.stop()

                async def source_empty() -> bool:
                    return (await lite.peek(src)).depth == 0

                await until(source_empty, 60, "everything delivered")
                assert bridge.stop() == 0, bridge.output()
        finally:
            await lite.close()
    got = await asyncio.to_thread(rabbit_ids, rabbitmq_url, queue)
    case = f"sqlite->rabbitmq, {BLACKHOLE:g} s blackhole: noticed {noticed:.1f} s, "
    report(f"{case}recovered {recovered:.1f} s", sent, got, CHAIN * BATCH)


async def test_postgres_to_sqlite_through_a_blackhole(
    tmp_path: Path, pg_dsn: str, pg_schema: str
) -> None:
    """The source's connection falls silent mid-receive: libpq would wait for ever; the
    watchdog interrupts the call after `response_timeout`, and the probe and new connections
    made during the outage time out too (`response_timeout`, `connect_timeout`)."""
    src, dst = unique("Src"), unique("Dst")
    http_port = free_port()
    with FaultProxy("127.0.0.1", 5432) as proxy:
        dsn = f"postgresql://postgres@{proxy.address}/test"
        config = write_config(
            tmp_path / "routes.yaml",
            http_port,
            [
                f'pg: {{type: postgresql, dsn: "{dsn}", schema: "{pg_schema}",'
                f" response_timeout: {RESPONSE_TIMEOUT}}}",
                f'lite: {{type: sqlite, path: "{tmp_path / "q.db"}"}}',
            ],
            [
                f"from: {{connection: pg, queue: {src}}}",
                f"to: {{connection: lite, queue: {dst}}}",
            ],
        )
        await asyncio.to_thread(run_to_end, config, "install")
        connections = load_config(config).config.connections
        lite = load("lite", connections["lite"])
        # The producer's connection, not through the proxy.
        direct = load(
            "direct",
            PostgresConnection.model_validate(
                {"type": "postgresql", "dsn": pg_dsn, "schema": pg_schema}
            ),
        )
        producer = Producer(direct, src)

        async def delivered() -> int:
            return (await lite.peek(dst)).depth

        try:
            with BridgeProcess(config, "run").start() as bridge:
                producer.start()
                noticed, recovered = await blackhole_mid_stream(
                    bridge, proxy, http_port, delivered, PG_NOTICE
                )
                sent = await producer.stop()

                async def source_empty() -> bool:
                    return (await direct.peek(src)).depth == 0

                await until(source_empty, 60, "everything delivered")
                assert bridge.stop() == 0, bridge.output()
            got = [e.message_id or "" for e in await drain(lite, dst, 1000)]
        finally:
            await direct.close()
            await lite.close()
    case = f"pg->sqlite, {BLACKHOLE:g} s blackhole: noticed {noticed:.1f} s, "
    report(f"{case}recovered {recovered:.1f} s", sent, got, 2 * BATCH)
