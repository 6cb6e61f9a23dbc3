"""Traces and the source depth gauge on the real runner and supervisor, against SQLite files
and the local Kafka broker (read back with plain aiokafka clients)."""

from __future__ import annotations

import asyncio
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client import REGISTRY

from bridge.config.loader import load_config
from bridge.config.models import BridgeConfig
from bridge.envelope import Envelope, Headers
from bridge.protocols import Sink, Source
from bridge.routing.runner import RouteRunner
from bridge.service.supervisor import Supervisor
from bridge.telemetry.tracing import RouteTracing
from bridge.transports import load
from bridge.transports.kafka import Transport as KafkaTransport
from bridge.transports.sql import SqlSink
from tests.conftest import unique

pytestmark = pytest.mark.integration

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def config(tmp_path: Path, kafka: str, routes: str) -> BridgeConfig:
    path = tmp_path / "routes.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            connections:
              db: {{type: sqlite, path: "{tmp_path / "queues.db"}"}}
              kafka: {{type: kafka, bootstrap_servers: "{kafka}", idempotence: false,
                       partitions: 3, session_timeout_ms: 3000}}
            routes:
            """
        )
        + textwrap.indent(textwrap.dedent(routes), "  ")
    )
    return load_config(path).config


async def until(condition: Callable[[], object], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_the_trace_goes_on_through_a_route_into_kafka(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    topic, queue = unique("traced"), unique("Traced")
    cfg = config(
        tmp_path,
        kafka_bootstrap,
        f"""\
        - name: traced
          from: {{connection: db, queue: "{queue}"}}
          to: {{connection: kafka, topic: "{topic}"}}
        """,
    )
    (route,) = cfg.routes
    db, kafka = load("db", cfg.connections["db"]), load("kafka", cfg.connections["kafka"])
    await db.install([queue, route.error_queue_name])
    await kafka.install([topic])
    parents = [f"{i:016x}" for i in range(1, 4)]
    await db.sink(queue).send(
        [
            Envelope(
                Headers(
                    [
                        ("NServiceBus.MessageId", f"m-{i}"),
                        ("traceparent", f"00-{TRACE_ID}-{parent}-01"),
                    ]
                ),
                b"x",
            )
            for i, parent in enumerate(parents)
        ]
    )
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    def endpoints() -> tuple[Source, Sink]:
        return db.source(queue, error_queue=route.error_queue_name), kafka.sink(topic)

    runner = RouteRunner(route, endpoints, poll_timeout=0.05, tracing=RouteTracing(route, provider))
    task = asyncio.create_task(runner.run())
    try:
        await until(lambda: runner.stats.forwarded == 3)
    finally:
        runner.stop()
        await task
        await db.close()
        await kafka.close()

    spans = exporter.get_finished_spans()
    publishes = {f"{s.parent.span_id:016x}": s for s in spans if s.parent is not None}
    assert sorted(publishes) == parents
    assert all(s.kind == SpanKind.PRODUCER for s in publishes.values())
    (batch,) = [s for s in spans if s.name == "traced batch"]
    assert sorted(f"{link.context.span_id:016x}" for link in batch.links) == parents
    assert {f"{link.context.trace_id:032x}" for link in batch.links} == {TRACE_ID}

    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        records = []
        while len(records) < 3:
            fetched = await consumer.getmany(timeout_ms=1000)
            records += [r for rs in fetched.values() for r in rs]
    finally:
        await consumer.stop()
    for record in records:
        headers = {k: v.decode() for k, v in record.headers}
        message_id = headers["NServiceBus.MessageId"]
        parent = parents[int(message_id.removeprefix("m-"))]
        span = publishes[parent]
        assert headers["traceparent"] == f"00-{TRACE_ID}-{span.context.span_id:016x}-01"


def depth(route: str) -> float | None:
    """The route's source depth as /metrics exports it."""
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.name == "bridge_source_depth" and sample.labels.get("route") == route:
                return sample.value
    return None


async def test_a_kafka_source_depth_is_its_group_lag(tmp_path: Path, kafka_bootstrap: str) -> None:
    """Two groups on one topic of 30 records: one consumes them, the other finds its position
    already stored in its destination (as `bridge migrate` leaves it). Both owe nothing after,
    though the topic still holds every record (what a peek would count)."""
    topic, fresh, migrated = unique("lag"), unique("fresh"), unique("migrated")
    out_fresh, out_migrated = unique("Fresh"), unique("Migrated")
    names = unique("consumed"), unique("stored")
    cfg = config(
        tmp_path,
        kafka_bootstrap,
        f"""\
        - name: {names[0]}
          from: {{connection: kafka, topic: "{topic}", group: "{fresh}"}}
          to: {{connection: db, queue: "{out_fresh}"}}
        - name: {names[1]}
          from: {{connection: kafka, topic: "{topic}", group: "{migrated}"}}
          to: {{connection: db, queue: "{out_migrated}"}}
        """,
    )
    db, kafka = load("db", cfg.connections["db"]), load("kafka", cfg.connections["kafka"])
    assert isinstance(kafka, KafkaTransport)
    try:
        await db.install([out_fresh, out_migrated])
        await kafka.install([topic, "bridge.error"])
        sink = kafka.sink(topic)
        for i in range(30):  # one record per batch: tansu reports a batch's end offset short
            await sink.send([Envelope(Headers([("NServiceBus.MessageId", f"m-{i}")]), b"x")])
        assert await kafka.lag(topic, fresh) == 30  # nothing committed: from the beginning
        assert (await kafka.peek(topic)).depth == 30
        ends = await end_offsets(kafka_bootstrap, topic)
        stored = {f"{migrated}/{topic}/{p}": end for p, end in ends.items()}
        store = db.sink(out_migrated)
        assert isinstance(store, SqlSink)
        await store.send([], stored)  # the positions only, as a finished migration leaves them
        assert await kafka.lag(topic, migrated) == 30  # nothing committed to Kafka
        assert await kafka.lag(topic, migrated, stored) == 0
    finally:
        await db.close()
        await kafka.close()

    supervisor = Supervisor(cfg, poll_timeout=0.1, depth_every=0.1)
    task = asyncio.create_task(supervisor.run())
    try:
        await until(lambda: supervisor.runners and supervisor.runners[0].stats.forwarded == 30)
        await until(lambda: depth(names[0]) == 0 and depth(names[1]) == 0)
        assert supervisor.runners[1].stats.forwarded == 0  # resumed at the stored positions
    finally:
        supervisor.stop()
        assert await task == 0


async def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        ends = await consumer.end_offsets(tps)
        return {tp.partition: offset for tp, offset in ends.items()}
    finally:
        await consumer.stop()
