"""Where bench messages live: a SQL queue table, a Kafka topic or a RabbitMQ queue.

Each place writes and reads with its raw driver (psycopg, sqlite3, aiokafka, pika), never
through the bridge, so it can measure a leg alone, fill a source, watch a destination, write at
a paced rate, time each message to its destination, and move one message per transaction (the
baseline). Tables, topics and queues are created by the bridge's own `install` (the layout users
get) under unique names, and removed by `drop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pika
import psycopg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner
from common import NUMBER, WRITTEN_AT, body_of, headers_json, headers_of, unique

from bridge.config.models import (
    KafkaConnection,
    PostgresConnection,
    RabbitMQConnection,
    SqliteConnection,
)
from bridge.envelope import Envelope, Headers
from bridge.transports.kafka import Transport as KafkaTransport
from bridge.transports.kafka.headers import to_record
from bridge.transports.rabbitmq import Transport as RabbitTransport
from bridge.transports.rabbitmq.headers import to_amqp
from bridge.transports.sql.postgresql import Transport as PostgresTransport
from bridge.transports.sql.queue import CHAIN, STAGE_FROM
from bridge.transports.sql.sqlite import Transport as SqliteTransport
from bridge.transports.sql.sqlite import set_up as sqlite_set_up

__all__ = ["KafkaPlace", "Place", "RabbitPlace", "SqlPlace", "make_messages"]

#: (headers, body) of one bench message; `headers` as a dict in endpoint order.
Message = tuple[dict[str, str], bytes]

POLL = 0.002  # seconds between polls of a latency consumer that found nothing


def make_messages(count: int, size: int, start: int = 0) -> list[Message]:
    now = time.time()
    body = body_of(size)
    return [(headers_of(start + i, now), body) for i in range(count)]


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class Place:
    """One address on one connection. Subclasses fill in the driver work."""

    kind = ""
    connection = ""  # name of the connection in routes.yaml

    def __init__(self, address: str) -> None:
        self.address = address
        #: when (time.time()) each latency `timed` returned was taken, in the same order
        self.arrivals: list[float] = []

    def connection_yaml(self) -> str:
        raise NotImplementedError

    def endpoint_yaml(self, role: str, group: str = "") -> str:
        return f"{{connection: {self.connection}, queue: {json.dumps(self.address)}}}"

    async def create(self) -> None:
        raise NotImplementedError

    async def drop(self) -> None:
        raise NotImplementedError

    async def write(self, messages: Sequence[Message], batch: int) -> float:
        """Write everything, `batch` per transaction/window; seconds taken."""
        raise NotImplementedError

    async def read(self, count: int, batch: int) -> float:
        """Take `count` messages, `batch` at a time, settling each; seconds from the first."""
        raise NotImplementedError

    async def paced(self, rate: float, seconds: float, size: int) -> int:
        """Write `rate` messages a second for `seconds`, each stamped when written."""
        raise NotImplementedError

    async def timed(self, expected: int, since: float, first: int, timeout: float) -> list[float]:
        """Consume until `expected` messages written after `since`, numbered `first` or later by
        `paced`, arrived; their latencies (the earlier ones are a warm-up), and when each arrived
        in `arrivals`."""
        raise NotImplementedError


# -- SQL ---------------------------------------------------------------------------------------


class SqlPlace(Place):
    """A queue table in PostgreSQL (a schema of its own) or SQLite (a file of its own)."""

    def __init__(self, kind: str, address: str, *, dsn: str = "", schema: str = "", path: str = ""):
        super().__init__(address)
        self.kind = kind
        self.connection = kind
        self.dsn, self.schema, self.path = dsn, schema, path
        transport: PostgresTransport | SqliteTransport
        if kind == "postgresql":
            cfg = PostgresConnection(type="postgresql", dsn=dsn, schema=schema)
            transport = PostgresTransport("bench", cfg)
            self.param = "%s"
        else:
            transport = SqliteTransport("bench", SqliteConnection(type="sqlite", path=path))
            self.param = "?"
        self.transport = transport
        self.statements = transport.dialect.queue_statements(address)
        self.table = transport.dialect.table(address)

    def connection_yaml(self) -> str:
        if self.kind == "postgresql":
            return f"{{type: postgresql, dsn: {json.dumps(self.dsn)}, schema: {self.schema}}}"
        return f"{{type: sqlite, path: {json.dumps(self.path)}}}"

    def connect(self, *, receiving: bool = False) -> Any:
        """A raw connection with the session settings the bridge's own would have (a source's
        when `receiving`), so that a raw leg and a route run on the same database settings."""
        if self.kind == "postgresql":
            db = psycopg.connect(self.dsn)
        else:
            db = sqlite3.connect(
                self.path, timeout=30, isolation_level=None, check_same_thread=False
            )
            sqlite_set_up(db)
        if receiving:
            self.transport.dialect.receiving_session(db)
        return db

    def _begin(self, db: Any) -> None:
        if self.kind == "sqlite":
            db.execute("BEGIN IMMEDIATE")

    async def create(self) -> None:
        await self.transport.install([self.address])
        await self.transport.close()

    async def drop(self) -> None:
        def run() -> None:
            db = self.connect()
            try:
                db.execute(f"DROP TABLE IF EXISTS {self.table}")
                db.commit()
            finally:
                db.close()

        await asyncio.to_thread(run)

    @staticmethod
    def rows(messages: Sequence[Message]) -> list[tuple[str, None, str, bytes]]:
        return [(str(uuid.uuid4()), None, headers_json(h), body) for h, body in messages]

    # raw legs ----------------------------------------------------------------------------------

    async def write(self, messages: Sequence[Message], batch: int, staged: bool = True) -> float:
        """Batched insert, a commit per batch. On PostgreSQL the way the bridge's sink inserts
        a batch of `STAGE_FROM` rows or more, unless not `staged`: a binary COPY into the
        session's temporary table, then the layout's INSERT ... SELECT (measured faster than
        psycopg's pipelined `executemany`, which `staged=False` runs instead)."""
        rows = self.rows(messages)
        dialect = self.transport.dialect
        staged = staged and bool(dialect.send_stage) and batch >= STAGE_FROM

        def run() -> float:
            db = self.connect()
            try:
                started = time.perf_counter()
                for chunk in _chunks(rows, batch):
                    self._begin(db)
                    if staged:
                        dialect.stage_rows(db, chunk)
                        db.cursor().execute(self.statements.send_staged)
                    else:
                        db.cursor().executemany(self.statements.send, chunk)
                    db.commit()
                return time.perf_counter() - started
            finally:
                db.close()

        return await asyncio.to_thread(run)

    async def read(self, count: int, batch: int) -> float:
        """Batched receive with the bridge's transaction shape: on PostgreSQL a commit per
        batch, on SQLite up to `CHAIN` batches per transaction (the bridge's SQLite source
        receives the next batch in the transaction holding the last; see `queue.py`)."""
        per_transaction = 1 if self.kind == "postgresql" else CHAIN

        def run() -> float:
            db = self.connect(receiving=True)
            try:
                got, started = 0, time.perf_counter()
                while got < count:
                    self._begin(db)
                    cursor = db.cursor()
                    for _ in range(per_transaction):
                        cursor.execute(self.statements.receive, (batch,))
                        got += len(cursor.fetchall())
                        if got >= count:
                            break
                    db.commit()
                return time.perf_counter() - started
            finally:
                db.close()

        return await asyncio.to_thread(run)

    # watching ----------------------------------------------------------------------------------

    def scalar(self, statement: str) -> Any:
        db = self.connect()
        try:
            row = db.execute(statement).fetchone()
            db.rollback()
            return None if row is None else row[0]
        finally:
            db.close()

    def watcher(self) -> Callable[[], int]:
        """Rows inserted so far into a fresh table (its highest seq: an index lookup)."""
        db = self.connect()
        if self.kind == "postgresql":
            db.autocommit = True
        statement = f"SELECT max(seq) FROM {self.table}"

        def inserted() -> int:
            row = db.execute(statement).fetchone()
            return int(row[0] or 0) if row else 0

        return inserted

    def emptiness(self) -> Callable[[], int | None]:
        """The lowest seq left (None: empty), one index lookup per call."""
        db = self.connect()
        if self.kind == "postgresql":
            db.autocommit = True
        statement = f"SELECT min(seq) FROM {self.table}"

        def lowest() -> int | None:
            row = db.execute(statement).fetchone()
            return None if row is None or row[0] is None else int(row[0])

        return lowest

    async def count(self) -> int:
        return int(await asyncio.to_thread(self.scalar, f"SELECT count(*) FROM {self.table}"))

    async def clear(self) -> None:
        """Empty the table and vacuum it, so that what is measured next meets a table like a
        fresh one, not 100,000 dead rows (and an autovacuum of them) left by this cleanup."""

        def run() -> None:
            db = self.connect()
            try:
                db.execute(f"DELETE FROM {self.table}")
                db.commit()
                if self.kind == "postgresql":
                    db.autocommit = True
                    db.execute(f"VACUUM {self.table}")
                else:
                    db.execute("VACUUM")
                    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                db.close()

        await asyncio.to_thread(run)

    # latency -----------------------------------------------------------------------------------

    async def paced(self, rate: float, seconds: float, size: int) -> int:
        body = body_of(size)

        def run() -> int:
            db = self.connect()
            try:
                sent, started = 0, time.monotonic()
                total = int(rate * seconds)
                while sent < total:
                    due = min(total, int((time.monotonic() - started) * rate) + 1) - sent
                    if due <= 0:
                        time.sleep(0.0005)
                        continue
                    now = time.time()
                    rows = [
                        (str(uuid.uuid4()), None, headers_json(headers_of(sent + i, now)), body)
                        for i in range(due)
                    ]
                    self._begin(db)
                    db.cursor().executemany(self.statements.send, rows)
                    db.commit()
                    sent += due
                return sent
            finally:
                db.close()

        return await asyncio.to_thread(run)

    async def timed(self, expected: int, since: float, first: int, timeout: float) -> list[float]:
        take = (
            f"DELETE FROM {self.table} WHERE seq IN "
            f"(SELECT seq FROM {self.table} ORDER BY seq LIMIT 1000"
            + (" FOR UPDATE SKIP LOCKED)" if self.kind == "postgresql" else ")")
            + " RETURNING headers"
        )

        def run() -> list[float]:
            db = self.connect()
            latencies: list[float] = []
            deadline = time.monotonic() + timeout
            try:
                while len(latencies) < expected and time.monotonic() < deadline:
                    self._begin(db)
                    rows = db.execute(take).fetchall()
                    db.commit()
                    now = time.time()
                    for (raw,) in rows:
                        headers = json.loads(raw)
                        written = float(headers[WRITTEN_AT])
                        if written >= since and int(headers[NUMBER]) >= first:
                            latencies.append(now - written)
                            self.arrivals.append(now)
                    if not rows:
                        time.sleep(POLL)
                return latencies
            finally:
                db.close()

        return await asyncio.to_thread(run)

    # one message per transaction -----------------------------------------------------------------

    def take_one(self, db: Any) -> tuple[dict[str, str], bytes] | None:
        """Delete the oldest row in an open transaction (commit/rollback is the caller's)."""
        self._begin(db)
        cursor = db.cursor()
        cursor.execute(self.statements.receive, (1,))
        row = cursor.fetchone()
        if row is None:
            db.rollback()
            return None
        return json.loads(row[2]), bytes(row[3])

    def put_one(self, db: Any, headers: dict[str, str], body: bytes) -> None:
        self._begin(db)
        db.execute(self.statements.send, (str(uuid.uuid4()), None, headers_json(headers), body))
        db.commit()


def postgres_place(dsn: str, schema: str, prefix: str) -> SqlPlace:
    return SqlPlace("postgresql", unique(prefix), dsn=dsn, schema=schema)


def sqlite_place(directory: Path, prefix: str) -> SqlPlace:
    name = unique(prefix)
    return SqlPlace("sqlite", name, path=str(directory / "bench.db"))


def drop_sqlite(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)


# -- Kafka -------------------------------------------------------------------------------------


#: Partitions of a topic `bridge install` creates, unless the connection says otherwise.
DEFAULT_PARTITIONS: int = KafkaConnection.model_fields["partitions"].default


class KafkaPlace(Place):
    """A topic of `partitions` partitions on the local broker."""

    kind = "kafka"
    connection = "kafka"

    def __init__(self, address: str, bootstrap: str, partitions: int = DEFAULT_PARTITIONS) -> None:
        super().__init__(address)
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.config = KafkaConnection(
            type="kafka",
            bootstrap_servers=bootstrap,
            idempotence=False,
            session_timeout_ms=3000,
            partitions=partitions,
        )
        self._verify: AIOKafkaConsumer | None = None

    def connection_yaml(self) -> str:
        return (
            f"{{type: kafka, bootstrap_servers: {json.dumps(self.bootstrap)}, "
            f"idempotence: false, session_timeout_ms: 3000, partitions: {self.partitions}}}"
        )

    def endpoint_yaml(self, role: str, group: str = "") -> str:
        if role == "from":
            return f"{{connection: kafka, topic: {self.address}, group: {group}}}"
        return f"{{connection: kafka, topic: {self.address}}}"

    async def create(self) -> None:
        transport = KafkaTransport("bench", self.config)
        await transport.install([self.address])
        await transport.close()

    async def drop(self) -> None:
        if self._verify is not None:
            await self._verify.stop()
            self._verify = None
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            with contextlib.suppress(Exception):  # the broker goes away at the end anyway
                await admin.delete_topics([self.address])
        finally:
            await admin.close()

    def producer(self, linger_ms: int = 0) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks="all",
            enable_idempotence=False,
            linger_ms=linger_ms,
            max_batch_size=1_048_576,
            max_request_size=1_048_576,
        )

    def consumer(self, group: str | None, fetch_max_wait_ms: int = 500) -> AIOKafkaConsumer:
        # tansu answers a fetch only when fetch_max_wait_ms has passed, even when records
        # arrived before: the latency consumer asks often, so it measures the route, not itself.
        return AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            fetch_max_wait_ms=fetch_max_wait_ms,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=1_048_576,
            session_timeout_ms=3000,
            heartbeat_interval_ms=1000,
        )

    @staticmethod
    def records(messages: Sequence[Message]) -> list[Any]:
        now = time.time()
        return [
            to_record(Envelope(Headers(h.items()), body), "header:NServiceBus.MessageId", now)
            for h, body in messages
        ]

    async def write(self, messages: Sequence[Message], batch: int) -> float:
        """One closed record batch per partition and window, each window acknowledged
        (acks=all) before the next: the most a producer does with `batch` in flight."""
        records = self.records(messages)
        producer = self.producer()
        await producer.start()
        try:
            partitions = sorted(await producer.partitions_for(self.address))
            partitioner = DefaultPartitioner()
            started = time.perf_counter()
            for chunk in _chunks(records, batch):
                builders: dict[int, Any] = {}
                for record in chunk:
                    partition = partitioner(record.key, partitions, partitions)
                    builder = builders.get(partition)
                    if builder is None:
                        builder = builders[partition] = producer.create_batch()
                    builder.append(
                        key=record.key,
                        value=record.value,
                        timestamp=record.timestamp_ms,
                        headers=record.headers,
                    )
                futures = []
                for partition, builder in builders.items():
                    builder.close()
                    futures.append(
                        await producer.send_batch(builder, self.address, partition=partition)
                    )
                await asyncio.gather(*futures)
            return time.perf_counter() - started
        finally:
            await producer.stop()

    async def read(self, count: int, batch: int) -> float:
        """A group consumer taking `batch` records at a time, committing each batch."""
        consumer = self.consumer(unique("bench-read"))
        await consumer.start()
        consumer.subscribe([self.address])
        try:
            got, started = 0, 0.0
            while got < count:
                fetched = await consumer.getmany(timeout_ms=1000, max_records=batch)
                n = sum(len(r) for r in fetched.values())
                if n and not started:
                    started = time.perf_counter()
                got += n
                if fetched:
                    await consumer.commit(
                        {tp: records[-1].offset + 1 for tp, records in fetched.items()}
                    )
            return time.perf_counter() - started
        finally:
            await consumer.stop()

    async def drain_all(self, minimum: int, timeout: float) -> tuple[int, int]:
        """Read the topic from its start until at least `minimum` records are seen and no more
        come: (records, distinct message ids). The consumer stays at the end for `timed`."""
        if self._verify is None:
            self._verify = self.consumer(None, fetch_max_wait_ms=5)
            await self._verify.start()
            tps = [TopicPartition(self.address, p) for p in range(self.partitions)]
            self._verify.assign(tps)
            await self._verify.seek_to_beginning(*tps)
        records, ids = 0, set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fetched = await self._verify.getmany(timeout_ms=500, max_records=5000)
            if not fetched and records >= minimum:
                break
            for batch in fetched.values():
                records += len(batch)
                for record in batch:
                    ids.add(dict(record.headers).get("NServiceBus.MessageId"))
        return records, len(ids)

    async def paced(self, rate: float, seconds: float, size: int) -> int:
        body = body_of(size)
        producer = self.producer(linger_ms=0)
        await producer.start()
        try:
            sent, started, pending = 0, time.monotonic(), []
            total = int(rate * seconds)
            while sent < total:
                due = min(total, int((time.monotonic() - started) * rate) + 1) - sent
                if due <= 0:
                    await asyncio.sleep(0.0005)
                    continue
                now = time.time()
                for record in self.records([(headers_of(sent + i, now), body) for i in range(due)]):
                    pending.append(
                        await producer.send(
                            self.address, record.value, key=record.key, headers=record.headers
                        )
                    )
                sent += due
            await asyncio.gather(*pending)
            return sent
        finally:
            await producer.stop()

    async def timed(self, expected: int, since: float, first: int, timeout: float) -> list[float]:
        if self._verify is None:
            await self.drain_all(0, 1.0)
        consumer = self._verify
        assert consumer is not None
        latencies: list[float] = []
        deadline = time.monotonic() + timeout
        while len(latencies) < expected and time.monotonic() < deadline:
            fetched = await consumer.getmany(timeout_ms=100, max_records=5000)
            now = time.time()
            for batch in fetched.values():
                for record in batch:
                    headers = dict(record.headers)
                    written = float(headers[WRITTEN_AT])
                    if written >= since and int(headers[NUMBER]) >= first:
                        latencies.append(now - written)
                        self.arrivals.append(now)
        return latencies


# -- RabbitMQ ----------------------------------------------------------------------------------


class RabbitPlace(Place):
    """A quorum queue behind its conventional fanout exchange (the bridge's defaults)."""

    kind = "rabbitmq"
    connection = "rabbit"

    def __init__(self, address: str, url: str) -> None:
        super().__init__(address)
        self.url = url
        self.config = RabbitMQConnection(type="rabbitmq", url=url)

    def connection_yaml(self) -> str:
        return f"{{type: rabbitmq, url: {json.dumps(self.url)}}}"

    async def create(self) -> None:
        transport = RabbitTransport("bench", self.config)
        await transport.install([self.address])
        await transport.close()

    def blocking(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.URLParameters(self.url))

    async def drop(self) -> None:
        def run() -> None:
            connection = self.blocking()
            try:
                channel = connection.channel()
                channel.queue_delete(self.address)
                channel.exchange_delete(self.address)
            finally:
                connection.close()

        await asyncio.to_thread(run)

    @staticmethod
    def amqp(messages: Sequence[Message]) -> list[tuple[pika.BasicProperties, bytes]]:
        now = time.time()
        return [to_amqp(Envelope(Headers(h.items()), body), now) for h, body in messages]

    def depth(self) -> Callable[[], int]:
        connection = self.blocking()
        channel = connection.channel()

        def ready() -> int:
            method = channel.queue_declare(self.address, passive=True).method
            return int(method.message_count)

        return ready

    async def count(self) -> int:
        def run() -> int:
            connection = self.blocking()
            try:
                method = connection.channel().queue_declare(self.address, passive=True).method
                return int(method.message_count)
            finally:
                connection.close()

        return await asyncio.to_thread(run)

    async def clear(self) -> None:
        def run() -> None:
            connection = self.blocking()
            try:
                connection.channel().queue_purge(self.address)
            finally:
                connection.close()

        await asyncio.to_thread(run)

    async def write(self, messages: Sequence[Message], batch: int) -> float:
        """Windows of `batch` messages in flight, each window fully confirmed before the next."""
        return await asyncio.to_thread(
            _confirm_windows, self.url, self.address, self.amqp(messages), batch
        )

    async def read(self, count: int, batch: int) -> float:
        """Consume with prefetch max(500, batch), acknowledging every `batch` (multiple)."""

        def run() -> float:
            connection = self.blocking()
            try:
                channel = connection.channel()
                channel.basic_qos(prefetch_count=max(500, batch))
                started = 0.0
                for got, (method, _, _) in enumerate(
                    channel.consume(self.address, inactivity_timeout=5), 1
                ):
                    if method is None:
                        break
                    if not started:
                        started = time.perf_counter()
                    last = method.delivery_tag
                    if got % batch == 0 or got == count:
                        channel.basic_ack(last, multiple=True)
                    if got >= count:
                        break
                elapsed = time.perf_counter() - started
                channel.cancel()
                return elapsed
            finally:
                connection.close()

        return await asyncio.to_thread(run)

    async def paced(self, rate: float, seconds: float, size: int) -> int:
        body = body_of(size)

        def run() -> int:
            connection = self.blocking()
            try:
                channel = connection.channel()
                sent, started = 0, time.monotonic()
                total = int(rate * seconds)
                while sent < total:
                    due = min(total, int((time.monotonic() - started) * rate) + 1) - sent
                    if due <= 0:
                        time.sleep(0.0005)
                        continue
                    now = time.time()
                    for props, data in self.amqp(
                        [(headers_of(sent + i, now), body) for i in range(due)]
                    ):
                        channel.basic_publish(self.address, "", data, props)
                    sent += due
                connection.process_data_events(0)
                return sent
            finally:
                connection.close()

        return await asyncio.to_thread(run)

    async def timed(self, expected: int, since: float, first: int, timeout: float) -> list[float]:
        def run() -> list[float]:
            connection = self.blocking()
            latencies: list[float] = []
            deadline = time.monotonic() + timeout
            try:
                channel = connection.channel()
                channel.basic_qos(prefetch_count=1000)
                for method, props, _ in channel.consume(
                    self.address, auto_ack=True, inactivity_timeout=0.5
                ):
                    if method is not None:
                        written = float(props.headers[WRITTEN_AT])
                        if written >= since and int(props.headers[NUMBER]) >= first:
                            now = time.time()
                            latencies.append(now - written)
                            self.arrivals.append(now)
                    if len(latencies) >= expected or time.monotonic() > deadline:
                        break
                channel.cancel()
                return latencies
            finally:
                connection.close()

        return await asyncio.to_thread(run)


def _confirm_windows(
    url: str, exchange: str, messages: Sequence[tuple[pika.BasicProperties, bytes]], window: int
) -> float:
    """Publish through a SelectConnection (pika's asynchronous adapter, as the bridge uses):
    `window` messages in flight, the next window once every confirm of this one arrived."""
    state: dict[str, Any] = {"next": 0, "unconfirmed": 0, "started": 0.0, "elapsed": 0.0}
    done = threading.Event()

    def publish_window(channel: Any) -> None:
        start = state["next"]
        chunk = messages[start : start + window]
        if not chunk:
            state["elapsed"] = time.perf_counter() - state["started"]
            channel.connection.close()
            return
        state["next"] = start + len(chunk)
        state["unconfirmed"] = len(chunk)
        for props, body in chunk:
            channel.basic_publish(exchange, "", body, props)

    def on_channel(channel: Any) -> None:
        def on_confirm(frame: Any) -> None:
            method = frame.method
            state["unconfirmed"] -= (
                method.delivery_tag - state["confirmed_tag"] if method.multiple else 1
            )
            state["confirmed_tag"] = max(state["confirmed_tag"], method.delivery_tag)
            if state["unconfirmed"] <= 0:
                publish_window(channel)

        def on_select(_: Any) -> None:
            state["started"] = time.perf_counter()
            publish_window(channel)

        state["confirmed_tag"] = 0
        channel.confirm_delivery(on_confirm, callback=on_select)

    def on_open(connection: Any) -> None:
        connection.channel(on_open_callback=on_channel)

    def on_closed(connection: Any, reason: Any) -> None:
        connection.ioloop.stop()
        done.set()

    connection = pika.SelectConnection(
        pika.URLParameters(url), on_open_callback=on_open, on_close_callback=on_closed
    )
    connection.ioloop.start()
    done.wait()
    return float(state["elapsed"])
