"""The fault suite: real `bridge run` processes, `kill -9` mid-stream, brokers and databases
stopped and started under load. Every case counts sent, delivered, lost (must be 0) and
duplicated (at most what was in flight: batch_size x concurrency per kill, a SQLite source's
open transaction of up to CHAIN batches); the run ends with a table of them (tests/faults.py).

Kafka -> SQL under kill -9 (exactly-once) is in test_routes_sql_kafka.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pika
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bridge.config.loader import load_config
from bridge.envelope import Envelope, Headers
from bridge.protocols import Transport
from bridge.transports import load
from bridge.transports.sql.chain import CHAIN
from tests.conftest import unique
from tests.faults import BridgeProcess, kill_mid_stream, report
from tests.support.queues import drain

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOTAL = 12_000
BATCH = 100
CONCURRENCY = 2
IN_FLIGHT = BATCH * CONCURRENCY
PARTITIONS = 3
KILLS = 3


class Rig:
    """A routes.yaml with every kind of connection, and ways to fill and count each side."""

    def __init__(self, tmp_path: Path, pg_dsn: str, schema: str, kafka: str, rabbit: str) -> None:
        self.kafka, self.rabbit, self.schema = kafka, rabbit, schema
        self.src, self.dst = unique("Src"), unique("Dst")
        self.topic, self.group = unique("topic"), unique("group")
        self.queue = unique("q")
        # The endpoint registry: Billing lives on RabbitMQ, Sales on PostgreSQL; each has a
        # proxy on the other side.
        self.billing, self.sales = unique("Billing"), unique("Sales")
        self.config = tmp_path / "routes.yaml"
        self.config.write_text(
            textwrap.dedent(
                f"""\
                connections:
                  pg: {{type: postgresql, dsn: "{pg_dsn}", schema: "{schema}"}}
                  kafka: {{type: kafka, bootstrap_servers: "{kafka}", idempotence: false,
                           partitions: {PARTITIONS}, session_timeout_ms: 3000}}
                  rabbit: {{type: rabbitmq, url: "{rabbit}", queue_type: quorum}}
                  lite: {{type: sqlite, path: "{tmp_path / "queues.db"}"}}
                routes:
                  - name: pg-to-kafka
                    from: {{connection: pg, queue: "{self.src}"}}
                    to: {{connection: kafka, topic: "{self.topic}"}}
                    batch_size: {BATCH}
                    concurrency: {CONCURRENCY}
                  - name: kafka-to-pg
                    from: {{connection: kafka, topic: "{self.topic}", group: "{self.group}"}}
                    to: {{connection: pg, queue: "{self.dst}"}}
                    batch_size: {BATCH}
                  - name: pg-to-rabbit
                    from: {{connection: pg, queue: "{self.src}"}}
                    to: {{connection: rabbit, queue: "{self.queue}"}}
                    batch_size: {BATCH}
                    concurrency: {CONCURRENCY}
                  - name: rabbit-to-pg
                    from: {{connection: rabbit, queue: "{self.queue}"}}
                    to: {{connection: pg, queue: "{self.dst}"}}
                    batch_size: {BATCH}
                    concurrency: {CONCURRENCY}
                  - name: sqlite-to-kafka
                    from: {{connection: lite, queue: "{self.src}"}}
                    to: {{connection: kafka, topic: "{self.topic}"}}
                    batch_size: {BATCH}
                    concurrency: {CONCURRENCY}
                endpoints:
                  {self.billing}: {{connection: rabbit}}
                  {self.sales}: {{connection: pg}}
                proxies: {{connections: [pg, rabbit], create: true, batch_size: {BATCH},
                          concurrency: {CONCURRENCY}}}
                """
            )
        )
        connections = load_config(self.config).config.connections
        self.pg: Transport = load("pg", connections["pg"])
        self.lite: Transport = load("lite", connections["lite"])
        self._offsets: AIOKafkaConsumer | None = None
        self.rabbit_transport: Transport = load("rabbit", connections["rabbit"])
        self.run("install")

    def bridge(self, *args: str) -> BridgeProcess:
        return BridgeProcess(self.config, *args)

    def run(self, *args: str) -> None:
        """Run the bridge to its end; it must exit 0 without a traceback."""
        with self.bridge(*args).start() as bridge:
            code = bridge.wait()
        assert code == 0, bridge.output()
        assert "Traceback" not in bridge.output(), bridge.output()

    async def fill_source(self, database: str = "pg") -> set[str]:
        """TOTAL messages into the `src` table of `database` (pg or sqlite)."""
        ids = [f"m{i}" for i in range(TOTAL)]
        sink = (self.lite if database == "sqlite" else self.pg).sink(self.src)
        for start in range(0, TOTAL, 1000):
            chunk = ids[start : start + 1000]
            await sink.send(
                [Envelope(Headers([("NServiceBus.MessageId", i)]), b"x" * 100) for i in chunk]
            )
        await sink.close()
        return set(ids)

    async def pg_ids(self, queue: str) -> list[str]:
        return [e.message_id or "" for e in await drain(self.pg, queue, 1000)]

    async def pg_depth(self, queue: str) -> int:
        return (await self.pg.peek(queue)).depth

    async def kafka_count(self) -> int:
        """Records in the topic: the sum of its partitions' end offsets."""
        if self._offsets is None:
            self._offsets = AIOKafkaConsumer(bootstrap_servers=self.kafka)
            await self._offsets.start()
        partitions = [TopicPartition(self.topic, p) for p in range(PARTITIONS)]
        return sum((await self._offsets.end_offsets(partitions)).values())

    async def kafka_ids(self) -> list[str]:
        consumer = AIOKafkaConsumer(
            self.topic,
            bootstrap_servers=self.kafka,
            group_id=unique("count"),
            auto_offset_reset="earliest",
            session_timeout_ms=3000,
            heartbeat_interval_ms=1000,
        )
        await consumer.start()
        ids: list[str] = []
        try:
            quiet = 0
            while quiet < 3:
                fetched = await consumer.getmany(timeout_ms=1000)
                quiet = 0 if fetched else quiet + 1
                for batch in fetched.values():
                    for record in batch:
                        ids.append(dict(record.headers)["NServiceBus.MessageId"].decode())
        finally:
            await consumer.stop()
        return ids

    def rabbit_ids(self, queue: str | None = None) -> list[str]:
        return [properties.message_id for properties in self.rabbit_messages(queue)]

    def rabbit_messages(self, queue: str | None = None) -> list[pika.BasicProperties]:
        connection = pika.BlockingConnection(pika.URLParameters(self.rabbit))
        channel = connection.channel()
        got = []
        while True:
            method, properties, _ = channel.basic_get(queue or self.queue, auto_ack=True)
            if method is None:
                break
            got.append(properties)
        connection.close()
        return got

    def rabbit_depth(self, queue: str | None = None) -> int:
        connection = pika.BlockingConnection(pika.URLParameters(self.rabbit))
        channel = connection.channel()
        depth = channel.queue_declare(queue or self.queue, passive=True).method.message_count
        connection.close()
        return int(depth)

    def fill_rabbit(self) -> set[str]:
        connection = pika.BlockingConnection(pika.URLParameters(self.rabbit))
        channel = connection.channel()
        channel.confirm_delivery()
        ids = [f"r{i}" for i in range(TOTAL)]
        for message_id in ids:
            channel.basic_publish(
                "",
                self.queue,
                b"y" * 100,
                pika.BasicProperties(
                    message_id=message_id,
                    delivery_mode=2,
                    headers={"NServiceBus.MessageId": message_id},
                ),
            )
        connection.close()
        return set(ids)

    async def close(self) -> None:
        if self._offsets is not None:
            await self._offsets.stop()
        await self.pg.close()
        await self.lite.close()
        await self.rabbit_transport.close()
        connection = pika.BlockingConnection(pika.URLParameters(self.rabbit))
        channel = connection.channel()
        for name in (self.queue, self.billing, self.sales):
            channel.queue_delete(name)
            channel.exchange_delete(name)
        connection.close()


@pytest.fixture
async def rig(
    tmp_path: Path, pg_dsn: str, pg_schema: str, kafka_bootstrap: str, rabbitmq_url: str
) -> AsyncIterator[Rig]:
    r = Rig(tmp_path, pg_dsn, pg_schema, kafka_bootstrap, rabbitmq_url)
    yield r
    await r.close()


def killed_at(at_kills: list[int]) -> str:
    return f"kill -9 at {'/'.join(map(str, at_kills))}"


async def test_pg_to_kafka_kill_9(rig: Rig) -> None:
    sent = await rig.fill_source()
    with rig.bridge("run", "--route", "pg-to-kafka") as bridge:
        at_kills = await kill_mid_stream(bridge, rig.kafka_count, TOTAL, KILLS)
    await asyncio.to_thread(rig.run, "run", "--route", "pg-to-kafka", "--until-idle", "1")
    assert await rig.pg_depth(rig.src) == 0
    bound = len(at_kills) * IN_FLIGHT
    report(f"pg->kafka, {killed_at(at_kills)}", sent, await rig.kafka_ids(), bound)


async def test_sqlite_to_kafka_kill_9(rig: Rig) -> None:
    """A SQLite source takes up to CHAIN batches in one transaction (one writer: it receives
    ahead in the transaction it holds), so a kill returns up to that many."""
    sent = await rig.fill_source("sqlite")
    with rig.bridge("run", "--route", "sqlite-to-kafka") as bridge:
        at_kills = await kill_mid_stream(bridge, rig.kafka_count, TOTAL, KILLS)
    await asyncio.to_thread(rig.run, "run", "--route", "sqlite-to-kafka", "--until-idle", "1")
    assert (await rig.lite.peek(rig.src)).depth == 0
    bound = len(at_kills) * CHAIN * BATCH
    report(f"sqlite->kafka, {killed_at(at_kills)}", sent, await rig.kafka_ids(), bound)


async def test_pg_to_rabbitmq_kill_9(rig: Rig) -> None:
    sent = await rig.fill_source()

    async def delivered() -> int:
        return await asyncio.to_thread(rig.rabbit_depth)

    with rig.bridge("run", "--route", "pg-to-rabbit") as bridge:
        at_kills = await kill_mid_stream(bridge, delivered, TOTAL, KILLS)
    await asyncio.to_thread(rig.run, "run", "--route", "pg-to-rabbit", "--until-idle", "1")
    bound = len(at_kills) * IN_FLIGHT
    report(f"pg->rabbitmq, {killed_at(at_kills)}", sent, rig.rabbit_ids(), bound)


async def test_registry_proxy_pg_to_rabbitmq_kill_9(rig: Rig) -> None:
    """A route the registry derives (Billing's proxy on PostgreSQL -> Billing on RabbitMQ),
    translating every message's reply address, killed mid-stream like any other."""
    await rig.rabbit_transport.install([rig.billing])  # the endpoint's own queue
    ids = [f"b{i}" for i in range(TOTAL)]
    reply_to = f'"{rig.schema}"."{rig.sales}"'
    sink = rig.pg.sink(rig.billing)
    for start in range(0, TOTAL, 1000):
        await sink.send(
            [
                Envelope(
                    Headers(
                        [("NServiceBus.MessageId", i), ("NServiceBus.ReplyToAddress", reply_to)]
                    ),
                    b"x" * 100,
                )
                for i in ids[start : start + 1000]
            ]
        )
    await sink.close()
    route = f"proxy.pg.{rig.billing}"

    async def delivered() -> int:
        return await asyncio.to_thread(rig.rabbit_depth, rig.billing)

    with rig.bridge("run", "--route", route) as bridge:
        at_kills = await kill_mid_stream(bridge, delivered, TOTAL, KILLS)
    await asyncio.to_thread(rig.run, "run", "--route", route, "--until-idle", "1")
    assert await rig.pg_depth(rig.billing) == 0
    got = await asyncio.to_thread(rig.rabbit_messages, rig.billing)
    assert {p.reply_to for p in got} == {rig.sales}  # translated to the Sales proxy
    bound = len(at_kills) * IN_FLIGHT
    report(
        f"registry proxy pg->rabbitmq, {killed_at(at_kills)}",
        set(ids),
        [p.message_id for p in got],
        bound,
    )


async def test_rabbitmq_to_pg_kill_9(rig: Rig) -> None:
    sent = await asyncio.to_thread(rig.fill_rabbit)

    async def delivered() -> int:
        return await rig.pg_depth(rig.dst)

    with rig.bridge("run", "--route", "rabbit-to-pg") as bridge:
        at_kills = await kill_mid_stream(bridge, delivered, TOTAL, KILLS)
    await asyncio.to_thread(rig.run, "run", "--route", "rabbit-to-pg", "--until-idle", "2")
    assert rig.rabbit_depth() == 0
    bound = len(at_kills) * IN_FLIGHT
    report(f"rabbitmq->pg, {killed_at(at_kills)}", sent, await rig.pg_ids(rig.dst), bound)


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=120)


def _postgres(action: str) -> None:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    command = ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action]
    subprocess.run(
        [*command, *(["-m", "fast"] if action == "stop" else [])], check=True, timeout=120
    )


async def outage(
    rig: Rig,
    route: str,
    progress: Callable[[], Awaitable[int]],
    stop: Callable[[], None],
    start: Callable[[], None],
) -> None:
    """Run the route, take the service away mid-stream for a few seconds, bring it back."""
    with rig.bridge("run", "--route", route, "--until-idle", "3").start() as bridge:
        deadline = time.monotonic() + 60
        while await progress() == 0:
            assert time.monotonic() < deadline and bridge.running, bridge.output()
            await asyncio.sleep(0.05)
        # The bridge is paused while the service goes away, so that the outage always comes
        # mid-stream: stopping a service takes a second or two, time enough to move it all.
        os.kill(bridge.pid, signal.SIGSTOP)
        try:
            await asyncio.to_thread(stop)
        finally:
            os.kill(bridge.pid, signal.SIGCONT)
        try:
            await asyncio.sleep(3)
            assert bridge.running, f"the bridge must stay up through the outage: {bridge.output()}"
        finally:
            await asyncio.to_thread(start)
        code = await asyncio.to_thread(bridge.wait)
    assert code == 0, bridge.output()
    assert "Traceback" not in bridge.output()


async def test_rabbitmq_restart_mid_stream(rig: Rig) -> None:
    sent = await rig.fill_source()

    async def moved() -> int:
        return TOTAL - await rig.pg_depth(rig.src)

    await outage(
        rig,
        "pg-to-rabbit",
        moved,
        lambda: _rabbitmqctl("stop_app"),
        lambda: _rabbitmqctl("start_app"),
    )
    assert await rig.pg_depth(rig.src) == 0
    report("pg->rabbitmq, RabbitMQ restarted", sent, rig.rabbit_ids(), IN_FLIGHT)


async def test_postgres_restart_mid_stream(rig: Rig) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=rig.kafka, enable_idempotence=False)
    await producer.start()
    sent = {f"k{i}" for i in range(TOTAL)}
    try:
        for message_id in sorted(sent):
            await producer.send(
                rig.topic, b"z", headers=[("NServiceBus.MessageId", message_id.encode())]
            )
        await producer.flush()
    finally:
        await producer.stop()

    async def moved() -> int:
        try:
            return await rig.pg_depth(rig.dst)
        except Exception:
            return 0

    await outage(rig, "kafka-to-pg", moved, lambda: _postgres("stop"), lambda: _postgres("start"))
    # Kafka -> SQL stores offsets with the rows: even across the outage, exactly once.
    report("kafka->pg, PostgreSQL restarted", sent, await rig.pg_ids(rig.dst), 0)
