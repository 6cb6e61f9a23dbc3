"""Commit outcome unknown: the connection drops after a commit was sent and before its answer
came back, so the service did the work and the bridge never learns it. A `bridge run` moves
messages that keep arriving while a fault proxy (tests/support/faultproxy.py, `arm` with the
triggers of tests/support/wire.py) lets a commit through, drops everything the service answers
and resets the connection, FIRINGS times per route. The commits:

- PostgreSQL, at the source or the destination: the transaction's `COMMIT`;
- RabbitMQ, at the destination: a batch's basic.publish, whose publisher confirms never come
  back; at the source: the consumer's basic.ack (it has no answer; the connection is reset
  once the broker has read it);
- Kafka, at the destination: the Produce request; at the source: the consumer group's
  OffsetCommit.

SQLite is a local file: it has no network commit, so it is only ever the other end (and
SQLite -> SQLite has no case). Each test faults one service on every route that has it at one
end, one route per transport pair and fault position (and, for PostgreSQL, a route between two
tables of one connection, which moves a batch in one transaction), all in one bridge process.
Each faulted connection goes through a proxy of its own (Kafka: one proxy, since the broker
advertises one address, and triggers matched by topic or group name, with a connection name,
and so a producer, per faulted route).

At least once holds everywhere: nothing is lost, and each firing duplicates at most what was in
flight on the faulted connection (batch_size x concurrency; from a SQLite source its open
chain of CHAIN batches). A route within one database is exactly-once (its source and
destination commit together), and so is Kafka -> SQL: the destination stores the positions in
the transaction of the rows (bridge/transports/sql/checkpoints.py), so after a lost COMMIT
answer the source reads them back from the database, and a lost OffsetCommit changes nothing.
Each case's name carries the longest time from a cut to the route running and forwarding again.
So that the cuts are known to have hit commits that carried a batch, the at-least-once routes
cut at their destination must have duplicated something, and a Kafka -> PostgreSQL route cut
at its COMMIT must have logged (at INFO) that it resumed from the stored positions, past the
batch it had been given back.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from bridge.config.loader import load_config
from bridge.envelope import Envelope, Headers
from bridge.protocols import Transport
from bridge.transports import load
from bridge.transports.sql.chain import CHAIN
from tests.conftest import unique
from tests.faults import BridgeProcess, report
from tests.integration.test_http import get
from tests.support.faultproxy import FaultProxy
from tests.support.localkafka import LocalKafka, free_port
from tests.support.queues import drain
from tests.support.wire import (
    AMQP,
    KAFKA,
    POSTGRES,
    Trigger,
    Wire,
    amqp_ack,
    amqp_publish,
    kafka_request,
    postgres_commit,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BATCH = 25
CONCURRENCY = 2
FIRINGS = 3
PARTITIONS = 2
#: Messages each source gets every 0.1 s while the cuts are made.
RATE = 5
ENDS = ["postgresql", "rabbitmq", "kafka", "sqlite"]
SHORT = {"postgresql": "pg", "rabbitmq": "rabbitmq", "kafka": "kafka", "sqlite": "sqlite"}
#: The connection of each kind that no fault touches.
PLAIN = {"postgresql": "pg", "rabbitmq": "rabbit", "kafka": "kafka", "sqlite": "lite"}
PRODUCE, OFFSET_COMMIT = 0, 8


@dataclass(eq=False)
class Case:
    """One route, its fault and what came of it."""

    at: str  # "source", "destination", or "both": one connection, one transaction
    source: str
    destination: str
    index: int
    src: str = field(default_factory=lambda: unique("Src"))
    dst: str = field(default_factory=lambda: unique("Dst"))
    group: str = field(default_factory=lambda: unique("group"))
    from_connection: str = ""
    to_connection: str = ""
    proxy: FaultProxy | None = None
    trigger: Trigger | None = None
    sent: set[str] = field(default_factory=set)
    recoveries: list[float] = field(default_factory=list)

    @property
    def route(self) -> str:
        return f"cut-{self.index}"

    @property
    def exactly_once(self) -> bool:
        from_kafka = self.source == "kafka" and self.destination in ("postgresql", "sqlite")
        return from_kafka or self.at == "both"

    @property
    def bound(self) -> int:
        if self.exactly_once:
            return 0
        in_flight = CHAIN * BATCH if self.source == "sqlite" else BATCH * CONCURRENCY
        return FIRINGS * in_flight

    @property
    def name(self) -> str:
        pair = f"{SHORT[self.source]}->{SHORT[self.destination]}"
        moving = f"moving again {max(self.recoveries):.1f} s" if self.recoveries else "no cut"
        at = "in one transaction" if self.at == "both" else f"at {self.at}"
        return f"commit unknown {at}, {pair}: {moving}"


def cases(service: str) -> list[Case]:
    """Every route with `service` at one end, faulted at that end."""
    out = [Case("source", service, other, 0) for other in ENDS]
    out += [Case("destination", other, service, 0) for other in ENDS]
    if service == "postgresql":  # a route within one database moves in one transaction
        out.append(Case("both", service, service, 0))
    for index, case in enumerate(out):
        case.index = index
    return out


class Rig:
    """The private Kafka broker behind its proxy, a proxy per faulted connection, routes.yaml,
    the feeding and the counting."""

    def __init__(self, tmp_path: Path, service: str, pg_dsn: str, schema: str, rabbit: str):
        self.tmp_path, self.service, self.pg_dsn, self.schema = tmp_path, service, pg_dsn, schema
        self.rabbit = rabbit
        self.http_port = free_port()
        self.broker_port = free_port()
        self.kafka_proxy = FaultProxy("127.0.0.1", self.broker_port, KAFKA)
        self.broker: LocalKafka | None = None
        self.cases = cases(service)
        self.proxies: list[FaultProxy] = [self.kafka_proxy]
        self.transports: dict[str, Transport] = {}
        self.config = tmp_path / "routes.yaml"
        self.routes: dict[str, dict[str, Any]] = {}
        self.routes_at = 0.0

    def start(self) -> None:
        """Start the proxies and the broker, write routes.yaml and install what it needs."""
        self.kafka_proxy.start()
        self.broker = LocalKafka(self.broker_port, advertised=self.kafka_proxy.address).start()
        self.connections = {
            "pg": self._pg(self.pg_dsn),
            "rabbit": self._rabbit(self.rabbit),
            "kafka": self._kafka(),
            "lite": f'{{type: sqlite, path: "{self.tmp_path / "queues.db"}"}}',
        }
        for case in self.cases:
            self._cut(case)
        self._write()
        self.run("install")
        connections = load_config(self.config).config.connections
        self.transports = {name: load(name, connections[name]) for name in PLAIN.values()}

    def _pg(self, dsn: str) -> str:
        return f'{{type: postgresql, dsn: "{dsn}", schema: "{self.schema}"}}'

    def _rabbit(self, url: str) -> str:
        return (
            f'{{type: rabbitmq, url: "{url}", queue_type: classic,'
            ' management_url: "http://guest:guest@127.0.0.1:15672"}'
        )

    def _kafka(self) -> str:
        return (
            f'{{type: kafka, bootstrap_servers: "{self.kafka_proxy.address}",'
            f" idempotence: false, partitions: {PARTITIONS}, session_timeout_ms: 3000}}"
        )

    def _cut(self, case: Case) -> None:
        """The connection through which `case`'s faulted end goes, and its trigger."""
        faulted = f"cut{case.index}"
        case.from_connection = faulted if case.at != "destination" else PLAIN[case.source]
        case.to_connection = faulted if case.at != "source" else PLAIN[case.destination]
        if self.service == "kafka":
            case.proxy = self.kafka_proxy
            self.connections[faulted] = self._kafka()  # a producer of its own
            case.trigger = (
                kafka_request(OFFSET_COMMIT, case.group)
                if case.at == "source"
                else kafka_request(PRODUCE, case.dst)
            )
            return
        if self.service == "postgresql":
            case.proxy = self._proxy(5432, POSTGRES)
            dsn = f"postgresql://postgres@{case.proxy.address}/test?sslmode=disable"
            self.connections[faulted] = self._pg(dsn)
            case.trigger = postgres_commit()
        else:
            case.proxy = self._proxy(5672, AMQP)
            self.connections[faulted] = self._rabbit(f"amqp://guest:guest@{case.proxy.address}/%2F")
            case.trigger = amqp_ack() if case.at == "source" else amqp_publish(case.dst)

    def _proxy(self, port: int, wire: Wire) -> FaultProxy:
        proxy = FaultProxy("127.0.0.1", port, wire).start()
        self.proxies.append(proxy)
        return proxy

    def _write(self) -> None:
        lines = [f"http: {{host: 127.0.0.1, port: {self.http_port}}}", "connections:"]
        lines += [f"  {name}: {value}" for name, value in self.connections.items()]
        lines.append("routes:")
        for case in self.cases:
            src = f"topic: {case.src}, group: {case.group}" if case.source == "kafka" else ""
            dst = "topic" if case.destination == "kafka" else "queue"
            lines += [
                f"  - name: {case.route}",
                f"    from: {{connection: {case.from_connection}, {src or 'queue: ' + case.src}}}",
                f"    to: {{connection: {case.to_connection}, {dst}: {case.dst}}}",
                f"    batch_size: {BATCH}",
                f"    concurrency: {CONCURRENCY}",
                # Its own, removed afterwards: the broker's `bridge.error` is other tests' too.
                f"    error_queue: {case.src}.errors",
            ]
        self.config.write_text("\n".join(lines) + "\n")

    def run(self, *args: str) -> None:
        with BridgeProcess(self.config, *args).start() as bridge:
            code = bridge.wait()
        assert code == 0, bridge.output()

    # ---- while the bridge runs

    async def feed(self, case: Case, stop: asyncio.Event) -> None:
        """RATE messages every 0.1 s into the case's source until `stop`."""
        sink = self.transports[PLAIN[case.source]].sink(case.src)
        n = 0
        try:
            while not stop.is_set():
                ids = [f"{case.index}-{n + i}" for i in range(RATE)]
                n += RATE
                await sink.send(
                    [Envelope(Headers([("NServiceBus.MessageId", i)]), b"x" * 100) for i in ids]
                )
                case.sent.update(ids)
                await asyncio.sleep(0.1)
        finally:
            await sink.close()

    async def watch_routes(self, bridge: BridgeProcess) -> None:
        """Keep `routes` (the /routes report by name) fresh."""
        while True:
            assert bridge.running, bridge.output()
            try:
                status, body = await asyncio.to_thread(get, self.http_port, "/routes")
            except OSError:  # not listening yet
                status = 0
            if status == 200:
                self.routes = {r["name"]: r for r in json.loads(body)["routes"]}
                self.routes_at = time.monotonic()
            await asyncio.sleep(0.1)

    def reported_after(self, since: float) -> Callable[[], bool]:
        return lambda: self.routes_at > since

    def moving(self, case: Case, since: float, forwarded: int) -> Callable[[], bool]:
        """Whether a report after `since` has the route running, past `forwarded`."""

        def now() -> bool:
            route = self.routes.get(case.route)
            return (
                route is not None
                and self.routes_at > since
                and route["state"] == "running"
                and route["forwarded"] > forwarded
            )

        return now

    async def cut(self, case: Case) -> None:
        """Fire the case's trigger FIRINGS times, each once the route moves again."""
        assert case.proxy is not None and case.trigger is not None
        await until(self.moving(case, 0.0, 0), 60, f"{case.route} moving at start")
        trigger = case.trigger
        for k in range(1, FIRINGS + 1):
            case.proxy.arm(trigger)
            await until(fired(trigger, k), 30, f"{case.route}: cut {k}")
            at = trigger.fired_at[-1]
            await until(self.reported_after(at), 10, "a /routes report")
            forwarded = self.routes[case.route]["forwarded"]
            await until(self.moving(case, at, forwarded), 30, f"{case.route} after cut {k}")
            case.recoveries.append(self.routes_at - at)

    def drained(self) -> bool:
        return len(self.routes) == len(self.cases) and all(
            r["state"] == "running" and r["idle_seconds"] >= 2 for r in self.routes.values()
        )

    # ---- counting

    async def delivered(self, case: Case) -> list[str]:
        if case.destination == "rabbitmq":
            return await asyncio.to_thread(self._rabbit_ids, case.dst)
        if case.destination == "kafka":
            return await self._kafka_ids(case.dst)
        transport = self.transports[PLAIN[case.destination]]
        return [e.message_id or "" for e in await drain(transport, case.dst, 1000)]

    def _rabbit_ids(self, queue: str) -> list[str]:
        connection = pika.BlockingConnection(pika.URLParameters(self.rabbit))
        channel = connection.channel()
        got = []
        while True:
            method, properties, _ = channel.basic_get(queue, auto_ack=True)
            if method is None:
                break
            got.append(properties.message_id)
        connection.close()
        return got

    async def _kafka_ids(self, topic: str) -> list[str]:
        """Every record of `topic`, read to its end offsets without a group (no join to wait
        for)."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.kafka_proxy.address, enable_auto_commit=False
        )
        await consumer.start()
        ids: list[str] = []
        try:
            partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
            consumer.assign(partitions)
            await consumer.seek_to_beginning(*partitions)
            ends = await consumer.end_offsets(partitions)
            deadline = time.monotonic() + 30
            while any([await consumer.position(tp) < ends[tp] for tp in partitions]):
                assert time.monotonic() < deadline, f"{topic}: not read to its end"
                fetched = await consumer.getmany(timeout_ms=500)
                for batch in fetched.values():
                    ids += [dict(r.headers)["NServiceBus.MessageId"].decode() for r in batch]
        finally:
            await consumer.stop()
        return ids

    async def close(self) -> None:
        for transport in self.transports.values():
            await transport.close()
        for proxy in self.proxies:
            proxy.close()
        if self.broker is not None:
            self.broker.stop()
        connection = pika.BlockingConnection(pika.URLParameters(self.rabbit))
        channel = connection.channel()
        for case in self.cases:
            for name in (case.src, case.dst, f"{case.src}.errors"):
                channel.queue_delete(name)
                channel.exchange_delete(name)
        connection.close()


def fired(trigger: Trigger, times: int) -> Callable[[], bool]:
    return lambda: trigger.fired >= times


async def until(condition: Callable[[], bool | Awaitable[bool]], timeout: float, what: str) -> None:
    start = time.monotonic()
    while True:
        done = condition()
        if not isinstance(done, bool):
            done = await done
        if done:
            return
        assert time.monotonic() - start < timeout, f"{what}: not within {timeout:g} s"
        await asyncio.sleep(0.05)


@pytest.fixture(params=["postgresql", "rabbitmq", "kafka"])
async def rig(
    request: pytest.FixtureRequest, tmp_path: Path, pg_dsn: str, pg_schema: str, rabbitmq_url: str
) -> AsyncIterator[Rig]:
    r = Rig(tmp_path, request.param, pg_dsn, pg_schema, rabbitmq_url)
    try:
        await asyncio.to_thread(r.start)
        yield r
    finally:
        await r.close()


async def test_commit_outcome_unknown(rig: Rig) -> None:
    """Every route with the service at one end, its commits cut FIRINGS times mid-stream."""
    stop = asyncio.Event()
    with BridgeProcess(rig.config, "run", log_level="INFO").start() as bridge:
        watching = asyncio.create_task(rig.watch_routes(bridge))
        feeding = [asyncio.create_task(rig.feed(case, stop)) for case in rig.cases]
        try:
            await asyncio.gather(*(rig.cut(case) for case in rig.cases))
            stop.set()
            await asyncio.gather(*feeding)
            await until(rig.drained, 60, "everything forwarded")
        finally:
            stop.set()
            watching.cancel()
            await asyncio.gather(watching, *feeding, return_exceptions=True)
        assert bridge.stop() == 0, bridge.output()
    assert "Traceback" not in bridge.output(), bridge.output()
    delivered = await asyncio.gather(*(rig.delivered(case) for case in rig.cases))
    failures = []
    duplicated = 0  # by the at-least-once cases cut at the destination
    for case, got in zip(rig.cases, delivered, strict=True):  # every row, then the first failure
        try:
            report(case.name, case.sent, got, case.bound)
        except AssertionError as exc:
            failures.append(exc)
        if case.at == "destination" and not case.exactly_once:
            duplicated += len(got) - len(set(got))
    if failures:
        raise failures[0]
    # A cut that only ever hit commits carrying no batch would prove nothing: at the
    # destination, a batch whose commit answer was lost is sent again.
    assert duplicated > 0, f"{rig.service}: no cut at a destination hit a batch"
    for case in rig.cases:
        if case.exactly_once and case.at == "destination":  # Kafka -> SQL, its COMMIT cut
            # After the lost answer, the source read the stored positions back and skipped
            # the batch that had been stored after all (bridge/transports/kafka/source.py).
            said = f"group {case.group}: {case.src}/"
            lines = [line for line in bridge.output().splitlines() if said in line]
            assert any("resumes at" in line for line in lines), f"{case.name}: none read back"
