"""The `BridgeDelays` producer against real databases and a real Kafka broker: on PostgreSQL
it waits (it does not poll again and again) while the only due row is held by another
producer; on SQLite it holds no write lock while a send is on its way, yet deletes a row only
after the destination acknowledged it."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bridge.config.models import BridgeConfig
from bridge.envelope import Envelope, Headers
from bridge.protocols import Sink
from bridge.service.delaying import DelayedProducer, delaying_sink
from bridge.service.movers import MAX_WAIT, MIN_WAIT
from bridge.transports import load
from bridge.transports.sql.connection import Connection
from bridge.transports.sql.transport import Transport as SqlTransport
from tests.conftest import unique
from tests.support.queues import topic_records

pytestmark = pytest.mark.integration


def config_with_delays(store: dict[str, Any], kafka: str) -> BridgeConfig:
    return BridgeConfig.model_validate(
        {
            "connections": {
                "db": store,
                "kafka": {
                    "type": "kafka",
                    "bootstrap_servers": kafka,
                    "idempotence": False,
                    "partitions": 1,
                },
            },
            "delays": {"connection": "db"},
        }
    )


def message(message_id: str, deliver_at: float | None = None) -> Envelope:
    return Envelope(Headers([("NServiceBus.MessageId", message_id)]), b"{}", deliver_at=deliver_at)


def counting(take: Callable[..., Any], calls: list[float]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(time.monotonic())
        return take(*args, **kwargs)

    return counted


async def takes_of_a_held_row(pg_dsn: str, pg_schema: str, next_due: str | None = None) -> int:
    """How often a producer takes in 2.5 x `MAX_WAIT` while another connection holds the only
    due row (FOR UPDATE, as another producer does while its send is on its way); `next_due`:
    the producer's next-due statement instead of its own."""
    config = config_with_delays(
        {"type": "postgresql", "dsn": pg_dsn, "schema": pg_schema}, "127.0.0.1:1"
    )
    store = load("db", config.connections["db"])
    assert isinstance(store, SqlTransport)
    stopping = asyncio.Event()
    holder = psycopg.connect(pg_dsn)
    takes: list[float] = []
    try:
        await store.install_delay_table()
        sink = delaying_sink(config, "kafka", "t", None, Unused(), lambda name: store)
        await sink.send([message("held", time.time() + 0.05)])
        await sink.close()
        await asyncio.sleep(0.1)
        holder.execute(f'SELECT Id FROM "{pg_schema}"."BridgeDelays" FOR UPDATE').fetchall()
        producer = DelayedProducer(store, lambda connection, address, key: Unused())
        if next_due is not None:
            producer.table.next_due = next_due
        producer.table.take_due = counting(producer.table.take_due, takes)  # type: ignore[method-assign]
        running = asyncio.create_task(producer.run(stopping))
        await asyncio.sleep(2.5 * MAX_WAIT)
        stopping.set()
        await running
    finally:
        stopping.set()
        holder.rollback()
        holder.close()
        await store.close()
    return len(takes)


async def test_postgresql_producer_waits_while_the_due_row_is_held_by_another(
    pg_dsn: str, pg_schema: str
) -> None:
    """Another producer holds the only due row: this one skips it when taking and when reading
    the next due time alike, so it waits `MAX_WAIT` between looks instead of looking again at
    once (thousands of times a second)."""
    takes = await takes_of_a_held_row(pg_dsn, pg_schema)
    print(f"takes of a held row in {2.5 * MAX_WAIT:.1f} s: {takes}")
    assert 1 <= takes <= 4, f"{takes} takes: the producer polls in a loop"


async def test_a_producer_that_sees_due_rows_it_cannot_take_waits_between_looks(
    pg_dsn: str, pg_schema: str
) -> None:
    """A next-due read that sees rows another producer holds (as SQL Server's READPAST alone
    sees rows under another's update locks), here PostgreSQL's without SKIP LOCKED: each look
    finds a row due and takes none, and the producer waits `MIN_WAIT`, doubled each time, up
    to `MAX_WAIT`, instead of looking again at once."""
    takes = await takes_of_a_held_row(
        pg_dsn,
        pg_schema,
        f'SELECT EXTRACT(EPOCH FROM Due - now()) FROM "{pg_schema}"."BridgeDelays" '
        "ORDER BY Due LIMIT 1",
    )
    print(f"takes of a held row seen due in {2.5 * MAX_WAIT:.1f} s: {takes}")
    # MIN_WAIT 0.05 s doubled: 0.05 + 0.1 + 0.2 + 0.4 + 0.8 + 1.0 > 2.5 s, six waits.
    assert MIN_WAIT == 0.05
    assert 1 <= takes <= 8, f"{takes} takes: the producer polls in a loop"


async def test_an_idle_sqlite_producer_takes_no_write_lock(tmp_path: Path) -> None:
    """A look at `BridgeDelays` that finds nothing due is a read (SQLite's write lock covers
    the whole file, and the producer looks about once a second): it returns at once while
    another writer holds the file, instead of waiting for the lock and failing."""
    path = tmp_path / "q.db"
    config = config_with_delays(
        {"type": "sqlite", "path": str(path), "busy_timeout": 0.5}, "127.0.0.1:1"
    )
    store = load("db", config.connections["db"])
    assert isinstance(store, SqlTransport)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        await store.install_delay_table()
        sink = delaying_sink(config, "kafka", "t", None, Unused(), lambda name: store)
        await sink.send([message("later", time.time() + 3600)])
        await sink.close()
        other.execute("BEGIN IMMEDIATE")
        producer = DelayedProducer(store, lambda connection, address, key: Unused())
        db = Connection(store.dialect, pool=store.pool)
        try:
            started = time.monotonic()
            taken = await db.run(partial(producer.table.take_due, 10))
            took = time.monotonic() - started
        finally:
            await db.close()
    finally:
        other.rollback()
        other.close()
        await store.close()
    assert taken == []
    assert took < 0.4, f"{took:.2f} s: the look waited for the write lock"


class Unused:
    """A destination nothing may reach (the row it would get is held by another)."""

    async def send(self, envelopes: Any, checkpoint: Any = None) -> None:
        raise AssertionError("a held row was sent")

    async def close(self) -> None:
        pass


class Gated:
    """A real Kafka sink whose sends wait until the test opens the gate, so the test can write
    to the SQLite file while a send is on its way."""

    def __init__(self, inner: Sink) -> None:
        self.inner = inner
        self.waiting = asyncio.Event()
        self.gate = asyncio.Event()
        self.sent: list[str | None] = []

    async def send(self, envelopes: Any, checkpoint: Any = None) -> None:
        self.waiting.set()
        await self.gate.wait()
        await self.inner.send(envelopes, checkpoint)
        self.sent.extend(e.message_id for e in envelopes)

    async def close(self) -> None:
        await self.inner.close()


def write_elsewhere(path: Path) -> None:
    """Another writer of the file: a write transaction, waiting at most 0.5 s for the lock."""
    with sqlite3.connect(path, timeout=0.5, isolation_level=None) as db:
        db.execute("BEGIN IMMEDIATE")
        db.execute("CREATE TABLE IF NOT EXISTS other (x)")
        db.execute("INSERT INTO other VALUES (1)")
        db.execute("COMMIT")


def rows(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute('SELECT count(*) FROM "BridgeDelays"').fetchone()[0])


async def until_no_rows(path: Path, seconds: float) -> None:
    for _ in range(round(seconds * 20)):
        if not rows(path):
            return
        await asyncio.sleep(0.05)


async def topic_ids(bootstrap: str, topic: str) -> list[bytes]:
    records = await topic_records(bootstrap, topic)
    return [dict(r.headers)["NServiceBus.MessageId"] for r in records]


async def test_sqlite_producer_holds_no_write_lock_while_the_kafka_send_is_on_its_way(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    """While the producer waits for Kafka, another writer of the file writes at once; the row
    is deleted only after Kafka acknowledged the record. A producer that dies while its send
    is on its way leaves the row, which is sent again (at least once, never lost)."""
    path = tmp_path / "q.db"
    topic = unique("delayed")
    config = config_with_delays({"type": "sqlite", "path": str(path)}, kafka_bootstrap)
    store = load("db", config.connections["db"])
    kafka = load("kafka", config.connections["kafka"])
    assert isinstance(store, SqlTransport)
    stopping = asyncio.Event()
    gated = Gated(kafka.sink(topic))
    try:
        await store.install_delay_table()
        sink = delaying_sink(config, "kafka", topic, None, kafka.sink(topic), lambda name: store)
        await sink.send([message("later", time.time() + 0.2)])
        await sink.close()
        # Due with it, for another destination (which the gated sink sends to the same topic):
        # taken after it, not held up by its claim.
        sink = delaying_sink(config, "kafka", "other", None, kafka.sink(topic), lambda name: store)
        await sink.send([message("other", time.time() + 0.2)])
        await sink.close()
        producer = DelayedProducer(store, lambda connection, address, key: gated)
        running = asyncio.create_task(producer.run(stopping))
        await asyncio.wait_for(gated.waiting.wait(), timeout=10)
        await asyncio.to_thread(write_elsewhere, path)  # "database is locked" while held
        assert rows(path) == 2  # not deleted before Kafka acknowledged it
        gated.gate.set()
        await until_no_rows(path, 10)
        assert gated.sent == ["later", "other"]
        stopping.set()
        await running

        # A producer that dies (cancelled) while its send is on its way: the row stays.
        sink = delaying_sink(config, "kafka", topic, None, kafka.sink(topic), lambda name: store)
        await sink.send([message("again", time.time() + 0.2)])
        await sink.close()
        stopping = asyncio.Event()
        stuck = Gated(kafka.sink(topic))
        producer = DelayedProducer(store, lambda connection, address, key: stuck)
        running = asyncio.create_task(producer.run(stopping))
        await asyncio.wait_for(stuck.waiting.wait(), timeout=10)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert rows(path) == 1
        stopping = asyncio.Event()
        producer = DelayedProducer(store, lambda connection, address, key: kafka.sink(topic))
        running = asyncio.create_task(producer.run(stopping))
        await until_no_rows(path, 10)  # given back at once, not when the claim runs out
        stopping.set()
        await running
    finally:
        stopping.set()
        await gated.close()
        await store.close()
        await kafka.close()
    assert rows(path) == 0
    assert sorted(await topic_ids(kafka_bootstrap, topic)) == [b"again", b"later", b"other"]


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
async def test_a_destination_that_is_down_backs_off_alone_and_the_others_go_out_on_time(
    tmp_path: Path, kafka_bootstrap: str, pg_dsn: str, pg_schema: str, kind: str
) -> None:
    """BridgeDelays serves every destination of the config. Kafka connection `down` (no broker
    answers) is due first: its send fails, its rows are given back and it backs off on its own,
    while the takes leave its rows out, so the message for topic `up` on the local broker goes
    out when due, not when `down` comes back (before: each take was the same oldest row of
    `down`, and `up` waited as long as the outage lasted)."""
    path = tmp_path / "q.db"
    topic = unique("up")
    db: dict[str, Any] = {"type": "sqlite", "path": str(path)}
    if kind == "postgresql":
        db = {"type": "postgresql", "dsn": pg_dsn, "schema": pg_schema}

    def waiting() -> int:
        if kind == "sqlite":
            return rows(path)
        with psycopg.connect(pg_dsn) as conn:
            found = conn.execute(f'SELECT count(*) FROM "{pg_schema}"."BridgeDelays"').fetchone()
        assert found is not None
        return int(found[0])

    config = BridgeConfig.model_validate(
        {
            "connections": {
                "db": db,
                "kafka": {
                    "type": "kafka",
                    "bootstrap_servers": kafka_bootstrap,
                    "idempotence": False,
                    "partitions": 1,
                },
                "down": {"type": "kafka", "bootstrap_servers": "127.0.0.1:1"},
            },
            "delays": {"connection": "db"},
        }
    )
    store = load("db", config.connections["db"])
    transports = {name: load(name, config.connections[name]) for name in ("kafka", "down")}
    assert isinstance(store, SqlTransport)
    stopping = asyncio.Event()
    try:
        await store.install_delay_table()
        due = time.time() + 0.5
        for connection, address, message_id in (("down", "t", "first"), ("kafka", topic, "next")):
            inner = transports[connection].sink(address)
            sink = delaying_sink(config, connection, address, None, inner, lambda name: store)
            await sink.send([message(message_id, due)])
            await sink.close()
            due += 0.1
        producer = DelayedProducer(
            store, lambda connection, address, key: transports[connection].sink(address, key=key)
        )
        running = asyncio.create_task(producer.run(stopping))
        for _ in range(200):
            if waiting() == 1:
                break
            await asyncio.sleep(0.05)
        arrived = time.time()
        backing_off = dict(producer.backing_off)
        stopping.set()
        await running
    finally:
        stopping.set()
        await store.close()
        for transport in transports.values():
            await transport.close()
    lateness = arrived - (due - 0.1)
    print(f"the message for the destination that is up arrived {lateness:.2f} s after due")
    assert await topic_ids(kafka_bootstrap, topic) == [b"next"]
    assert lateness < 3.0
    assert list(backing_off) == [("down", "t")]
    assert waiting() == 1  # the one for `down`, given back: it goes out when `down` is back
