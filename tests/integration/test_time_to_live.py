"""Time to live across transports, through real brokers and databases and the route runner.

What says a message expired is the transport's own field (product.md, delivery semantics):
SQL `Expires`, AMQP `expiration`, and on Kafka the deadline header the bridge writes
(`NServiceBus.Bridge.ExpiresAt`), never `NServiceBus.TimeSent` + `NServiceBus.TimeToBeReceived`.
The header travels as the endpoint wrote it, and error-queue and audit copies never expire.

Facts from the sources (commits as in the spec's fidelity-gaps.md):
- NServiceBus.RabbitMQ@ec745bf, src/NServiceBus.Transport.RabbitMQ/Sending/
  BasicPropertiesExtensions.cs:30-39: a time to be received is sent as `expiration` alone;
  Receiving/MessageConverter.cs:30-90 reads no lifetime at all (the broker drops expired
  messages), and strips `x-dotnet-pub-seq-no` (:44), which the .NET client adds to every
  publish it tracks for confirms.
- NServiceBus@1d53488, src/NServiceBus.Core/Recoverability/MoveToError.cs:45-57: an error copy
  is a new outgoing message with the original headers (TimeToBeReceived and TimeSent included)
  routed to the error queue with no `DiscardIfNotReceivedBefore`, i.e. without a time to live.
- NServiceBus@1d53488, src/NServiceBus.Core/Performance/TimeToBeReceived/
  ApplyTimeToBeReceivedBehavior.cs:16-20: the header is the endpoint's own value, written next
  to the dispatch property each transport turns into its time to live.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pika
import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from bridge.config.models import Route
from bridge.nservicebus.wireformat import timestamp_seconds
from bridge.protocols import Sink, Source, Transport
from bridge.routing.runner import RouteRunner
from bridge.transports.kafka.headers import EXPIRES_AT
from tests.conftest import unique
from tests.contract.variants import KAFKA, build
from tests.unit.test_runner import run_until

pytestmark = pytest.mark.integration

TTBR = "NServiceBus.TimeToBeReceived"
LONG_AGO = "2020-01-01 00:00:00:000000 Z"
ERROR_COPY = {
    "NServiceBus.FailedQ": "Sales",
    "NServiceBus.ExceptionInfo.ExceptionType": "System.InvalidOperationException",
    "NServiceBus.ExceptionInfo.Message": "boom",
    "NServiceBus.TimeOfFailure": LONG_AGO,
}
AUDIT_COPY = {
    "NServiceBus.ProcessingStarted": LONG_AGO,
    "NServiceBus.ProcessingEnded": LONG_AGO,
    "NServiceBus.ProcessingEndpoint": "Sales",
}


def endpoint_headers(message_id: str, ttbr: str, *extra: dict[str, str]) -> dict[str, Any]:
    """Headers as an endpoint sent them, long ago, with a short time to be received."""
    headers: dict[str, Any] = {
        "NServiceBus.MessageId": message_id,
        "NServiceBus.MessageIntent": "Send",
        "NServiceBus.ContentType": "application/json",
        "NServiceBus.EnclosedMessageTypes": "Shop.OrderPlaced, Shop",
        "NServiceBus.TimeSent": LONG_AGO,
        TTBR: ttbr,
    }
    for more in extra:
        headers.update(more)
    return headers


# -- places ----------------------------------------------------------------------------------


@dataclass
class Row:
    text: str  # the Headers column as stored
    headers: dict[str, str | None]
    expires: float | None  # epoch seconds


@dataclass
class Sql:
    transport: Transport
    rows: Callable[[str], list[Row]]


def _epoch(value: object) -> float | None:
    if value is None:
        return None
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _rows(fetched: list[tuple[Any, Any]]) -> list[Row]:
    return [Row(text, json.loads(text), _epoch(expires)) for text, expires in fetched]


def sqlite_rows(path: str, table: str) -> list[Row]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return _rows(db.execute(f'SELECT headers, expires FROM "{table}" ORDER BY seq').fetchall())


@pytest.fixture(params=["sqlite", "postgresql"])
async def sql(request: pytest.FixtureRequest, sqlite_path: str) -> AsyncIterator[Sql]:
    if request.param == "sqlite":
        transport = build("db", {"type": "sqlite", "path": sqlite_path})

        def rows(table: str) -> list[Row]:
            return sqlite_rows(sqlite_path, table)

    else:
        dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
        transport = build("db", {"type": "postgresql", "dsn": dsn, "schema": schema})

        def rows(table: str) -> list[Row]:
            with psycopg.connect(dsn) as db:
                query = f'SELECT headers, expires FROM "{schema}"."{table}" ORDER BY seq'
                return _rows(db.execute(query).fetchall())

    try:
        yield Sql(transport, rows)
    finally:
        await transport.close()


@pytest.fixture
async def rabbit(rabbitmq_url: str) -> AsyncIterator[Transport]:
    transport = build("rabbit", {"type": "rabbitmq", "url": rabbitmq_url, "topology": "direct"})
    try:
        yield transport
    finally:
        await transport.close()


@pytest.fixture
async def kafka(kafka_bootstrap: str) -> AsyncIterator[Transport]:
    transport = build("kafka", {**KAFKA, "bootstrap_servers": kafka_bootstrap})
    try:
        yield transport
    finally:
        await transport.close()


@pytest.fixture
def channel(rabbitmq_url: str) -> Iterator[Any]:
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        yield connection.channel()
    finally:
        connection.close()


def publish(
    channel: Any, queue: str, headers: dict[str, Any], expiration: str | None = None
) -> None:
    """Publish as an NServiceBus RabbitMQ endpoint does, with the .NET client's sequence
    number header."""
    properties = pika.BasicProperties(
        message_id=headers["NServiceBus.MessageId"],
        content_type="application/json",
        delivery_mode=2,
        expiration=expiration,
        headers={**headers, "x-dotnet-pub-seq-no": 7},
    )
    channel.basic_publish("", queue, b"{}", properties)


async def cross(
    source: Transport, origin: dict[str, str], sink: Transport, target: dict[str, str], count: int
) -> RouteRunner:
    """Run a route from `origin` on `source` to `target` on `sink` (route keys: `queue`, or
    `topic` and `group`) until it has handled `count` messages."""
    errors = unique("errors")
    route = Route.model_validate(
        {
            "name": "ttl",
            "from": {"connection": "src", **origin},
            "to": {"connection": "dst", **target},
            "error_queue": errors,
        }
    )

    def endpoints() -> tuple[Source, Sink]:
        src = source.source(route.from_.address, group=origin.get("group"), error_queue=errors)
        return src, sink.sink(route.to.address)

    runner = RouteRunner(route, endpoints, poll_timeout=0.05)
    stats = runner.stats
    await run_until(runner, lambda: stats.forwarded + stats.expired + stats.poison >= count, 60)
    return runner


async def kafka_records(bootstrap: str, topic: str, count: int) -> list[Any]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=unique("read"), auto_offset_reset="earliest"
    )
    await consumer.start()
    records: list[Any] = []
    try:
        while len(records) < count:
            fetched = await consumer.getmany(timeout_ms=10_000)
            assert fetched, f"only {len(records)} of {count} records arrived"
            records.extend(r for batch in fetched.values() for r in batch)
    finally:
        await consumer.stop()
    return records


# -- RabbitMQ -> SQL -------------------------------------------------------------------------


async def test_error_and_audit_copies_from_rabbitmq_cross_to_sql_intact_and_never_expire(
    sql: Sql, rabbit: Transport, channel: Any, rabbitmq_queues: Callable[[str], str]
) -> None:
    """Copies with a one-second TimeToBeReceived sent years ago arrive, header unchanged and
    without `Expires`, even those that carry an `expiration`."""
    queue, table = rabbitmq_queues("copies"), unique("Copies")
    await rabbit.install([queue])
    await sql.transport.install([table])
    publish(channel, queue, endpoint_headers("error", "00:00:01", ERROR_COPY))
    publish(channel, queue, endpoint_headers("audit", "00:00:01", AUDIT_COPY))
    publish(channel, queue, endpoint_headers("error-ttl", "00:00:01", ERROR_COPY), "60000")
    publish(channel, queue, endpoint_headers("audit-ttl", "00:00:01", AUDIT_COPY), "60000")

    runner = await cross(rabbit, {"queue": queue}, sql.transport, {"queue": table}, 4)

    assert (runner.stats.forwarded, runner.stats.expired) == (4, 0)
    rows = sql.rows(table)
    assert [r.headers["NServiceBus.MessageId"] for r in rows] == [
        "error",
        "audit",
        "error-ttl",
        "audit-ttl",
    ]
    for row in rows:
        assert '"NServiceBus.TimeToBeReceived":"00:00:01"' in row.text
        assert row.expires is None
        assert "x-dotnet-pub-seq-no" not in row.headers


async def test_a_message_from_rabbitmq_lives_by_its_expiration_alone(
    sql: Sql, rabbit: Transport, channel: Any, rabbitmq_queues: Callable[[str], str]
) -> None:
    """No `expiration`: never expires, whatever TimeSent + TimeToBeReceived say. With one: the
    row's `Expires` is `expiration` after the bridge received it, the header unchanged."""
    queue, table = rabbitmq_queues("live"), unique("Live")
    await rabbit.install([queue])
    await sql.transport.install([table])
    before = time.time()
    publish(channel, queue, endpoint_headers("no-expiration", "00:00:01"))
    publish(channel, queue, endpoint_headers("expiration", "00:10:00"), "600000")
    bare = {"NServiceBus.MessageId": "expiration-only"}
    publish(channel, queue, bare, "600000")

    runner = await cross(rabbit, {"queue": queue}, sql.transport, {"queue": table}, 3)
    after = time.time()

    assert (runner.stats.forwarded, runner.stats.expired) == (3, 0)
    first, second, third = sql.rows(table)
    assert first.headers["NServiceBus.MessageId"] == "no-expiration"
    assert '"NServiceBus.TimeToBeReceived":"00:00:01"' in first.text
    assert first.expires is None
    assert '"NServiceBus.TimeToBeReceived":"00:10:00"' in second.text
    assert TTBR not in third.headers
    for row in (second, third):
        assert row.expires is not None
        assert before + 600 - 1 <= row.expires <= after + 600 + 1
        assert "x-dotnet-pub-seq-no" not in row.headers


# -- Kafka -> SQL ----------------------------------------------------------------------------


async def test_a_kafka_record_expires_by_the_deadline_header_alone_and_copies_never(
    sql: Sql, kafka: Transport, kafka_bootstrap: str
) -> None:
    """Records written an hour ago with a one-second TimeToBeReceived: copies and a message
    without the bridge's deadline header arrive unchanged, without `Expires`; a copy's deadline
    header, even a past one, is not read and not carried."""
    topic, table = unique("ttl"), unique("FromKafka")
    await kafka.install([topic])
    await sql.transport.install([table])
    messages = [
        endpoint_headers("error", "00:00:01", ERROR_COPY),
        endpoint_headers("audit", "00:00:01", AUDIT_COPY),
        endpoint_headers("ttbr-only", "00:00:01"),
        endpoint_headers("error-deadline", "00:00:01", ERROR_COPY, {EXPIRES_AT: LONG_AGO}),
    ]
    an_hour_ago = int((time.time() - 3600) * 1000)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False)
    await producer.start()
    try:
        for headers in messages:
            encoded = [(name, value.encode()) for name, value in headers.items()]
            await producer.send_and_wait(topic, b"{}", headers=encoded, timestamp_ms=an_hour_ago)
    finally:
        await producer.stop()

    origin = {"topic": topic, "group": unique("g")}
    runner = await cross(kafka, origin, sql.transport, {"queue": table}, 4)

    assert (runner.stats.forwarded, runner.stats.expired) == (4, 0)
    rows = sql.rows(table)
    assert [r.headers["NServiceBus.MessageId"] for r in rows] == [
        "error",
        "audit",
        "ttbr-only",
        "error-deadline",
    ]
    for row in rows:
        assert '"NServiceBus.TimeToBeReceived":"00:00:01"' in row.text
        assert row.expires is None
        assert EXPIRES_AT not in row.headers


# -- RabbitMQ -> Kafka -> SQL ----------------------------------------------------------------


async def test_rabbitmq_expiration_becomes_the_kafka_deadline_and_is_dropped_once_past(
    rabbit: Transport,
    kafka: Transport,
    kafka_bootstrap: str,
    channel: Any,
    rabbitmq_queues: Callable[[str], str],
    sqlite_path: str,
) -> None:
    queue, topic, table = rabbitmq_queues("to-kafka"), unique("deadline"), unique("Late")
    await rabbit.install([queue])
    await kafka.install([topic])
    before = time.time()
    publish(channel, queue, endpoint_headers("expiring", "00:00:03"), "3000")
    publish(channel, queue, endpoint_headers("lasting", "00:00:03"))

    runner = await cross(rabbit, {"queue": queue}, kafka, {"topic": topic}, 2)
    after = time.time()

    assert (runner.stats.forwarded, runner.stats.expired) == (2, 0)
    expiring, lasting = await kafka_records(kafka_bootstrap, topic, 2)
    for record in (expiring, lasting):
        assert (TTBR, b"00:00:03") in record.headers
        assert "x-dotnet-pub-seq-no" not in dict(record.headers)
    deadline = timestamp_seconds(dict(expiring.headers)[EXPIRES_AT].decode())
    assert before + 3 - 0.01 <= deadline <= after + 3 + 0.01
    assert EXPIRES_AT not in dict(lasting.headers)

    await asyncio.sleep(max(0.0, deadline - time.time()) + 0.05)
    sqlite = build("db", {"type": "sqlite", "path": sqlite_path})
    try:
        await sqlite.install([table])
        origin = {"topic": topic, "group": unique("g")}
        runner = await cross(kafka, origin, sqlite, {"queue": table}, 2)
    finally:
        await sqlite.close()

    assert (runner.stats.forwarded, runner.stats.expired) == (1, 1)
    (row,) = sqlite_rows(sqlite_path, table)
    assert row.headers["NServiceBus.MessageId"] == "lasting"
    assert '"NServiceBus.TimeToBeReceived":"00:00:03"' in row.text
    assert row.expires is None


# -- bridge send --ttl -----------------------------------------------------------------------


def test_bridge_send_ttl_sets_the_header_as_an_endpoint_does_and_the_expiration(
    tmp_path: Path, rabbitmq_url: str, channel: Any, rabbitmq_queues: Callable[[str], str]
) -> None:
    queue = rabbitmq_queues("sent")
    routes = tmp_path / "routes.yaml"
    routes.write_text(
        f'connections:\n  rabbit: {{type: rabbitmq, url: "{rabbitmq_url}", topology: direct}}\n'
        "routes: []\n"
    )
    channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    command = [sys.executable, "-m", "bridge", "send", "rabbit", queue, "--ttl", "00:00:30"]
    sent = subprocess.run([*command, "-c", str(routes)], capture_output=True, text=True, timeout=60)
    assert sent.returncode == 0, sent.stderr
    _, properties, _ = channel.basic_get(queue, auto_ack=True)
    assert properties.headers[TTBR] == "00:00:30"
    assert properties.expiration == "30000"  # as given, not counted down a moment later
