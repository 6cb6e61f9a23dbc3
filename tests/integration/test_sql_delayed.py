"""Delayed tables on real PostgreSQL and SQLite: many delayed messages due at one second are
moved once each, in batches, by two movers competing; a message NServiceBus delayed on the
source side crosses PostgreSQL -> RabbitMQ once and at once, its `NServiceBus.DeliverAt` never
read; a row whose ForwardDestination names another queue goes there on the source connection.

NServiceBus.SqlServer: Sql.Shared/DelayedDelivery/DueDelayedMessageProcessor.cs:86-101 (one
transaction per batch), DelayedDeliveryOptions.cs:38 (batches of 100), PostgreSqlConstants.cs:
21-30 (the store, used here to write the rows as an endpoint would), :46-53 (the move),
Sql.Shared/Receiving/ProcessStrategy.cs:75-124 (a receiver strips ForwardDestination; when it
names another queue, the message is sent there in the receive's transaction).
"""

from __future__ import annotations

import asyncio
import sqlite3
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pika
import psycopg
import pytest

from bridge.config.loader import load_config
from bridge.envelope import Envelope, Headers
from bridge.nservicebus.wireformat import format_timestamp
from bridge.service.movers import MAX_WAIT, MIN_WAIT, DelayedMover
from bridge.transports import load
from bridge.transports.sql import headers as headers_codec
from bridge.transports.sql.delayed import FORWARD_DESTINATION, MISSING_DELAYED_TABLE, store_params
from bridge.transports.sql.transport import Transport as SqlTransport
from tests.conftest import unique
from tests.faults import BridgeProcess
from tests.support.queues import drain

pytestmark = pytest.mark.integration

MANY = 10_000


def rabbit_arrivals(url: str, queue: str, until: float) -> list[tuple[float, Any]]:
    """When each message reached `queue` and its properties: the first, polled until `until`,
    then any that follow within 2 s."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    arrivals: list[tuple[float, Any]] = []
    try:
        while time.time() < until and not arrivals:
            method, properties, _ = channel.basic_get(queue, auto_ack=True)
            if method is None:
                time.sleep(0.05)
                continue
            arrivals.append((time.time(), properties))
        time.sleep(2.0)
        while (got := channel.basic_get(queue, auto_ack=True))[0] is not None:
            arrivals.append((time.time(), got[1]))
    finally:
        connection.close()
    return arrivals


def sql_connection(kind: str, tmp_path: Path, pg_dsn: str, schema: str) -> dict[str, Any]:
    if kind == "sqlite":
        return {"type": "sqlite", "path": str(tmp_path / "q.db")}
    return {"type": "postgresql", "dsn": pg_dsn, "schema": schema}


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
async def test_10000_delayed_messages_due_at_one_second_are_moved_once_in_batches(
    tmp_path: Path, pg_dsn: str, pg_schema: str, kind: str
) -> None:
    from bridge.config.models import BridgeConfig

    config = BridgeConfig.model_validate(
        {"connections": {"db": sql_connection(kind, tmp_path, pg_dsn, pg_schema)}}
    )
    transport = load("db", config.connections["db"])
    assert isinstance(transport, SqlTransport)
    movers = [DelayedMover(transport, "Out"), DelayedMover(transport, "Out")]
    stopping = asyncio.Event()
    try:
        await transport.install(["Out"])
        due = time.time() + 1.5
        sink = transport.sink("Out")
        sent = [f"m-{n}" for n in range(MANY)]
        await sink.send(
            [Envelope(Headers([("NServiceBus.MessageId", i)]), b"{}", deliver_at=due) for i in sent]
        )
        await sink.close()
        assert (await transport.peek("Out")).delayed == MANY
        running = [asyncio.create_task(m.run(stopping)) for m in movers]
        await asyncio.sleep(max(0.0, due - time.time()))
        before = sum(m.moves for m in movers)
        started = time.monotonic()
        deadline = started + 60
        while time.monotonic() < deadline:
            if not (await transport.peek("Out")).delayed:
                break
            await asyncio.sleep(0.02)
        took = time.monotonic() - started
        stopping.set()
        await asyncio.gather(*running)
        moves = sum(m.moves for m in movers) - before
        got = [e.message_id for e in await drain(transport, "Out", batch_size=5000)]
    finally:
        stopping.set()
        await transport.close()
    print(f"\n{kind}: {MANY} due at one second moved in {took:.2f} s, {moves} rounds")
    assert sorted(got) == sorted(sent)  # each once
    # Rounds of the movers: batches of 100 (and a few looks that found nothing due, or
    # rows the other mover held): never one transaction per message.
    assert MANY // 100 <= moves < MANY // 20


async def test_a_message_nservicebus_delayed_crosses_postgresql_to_rabbitmq_once_and_at_once(
    tmp_path: Path, pg_dsn: str, pg_schema: str, rabbitmq_url: str, rabbitmq_queues: Any
) -> None:
    """An NServiceBus endpoint delayed it: a row of the source's Delayed table, moved by the
    mover into the source, which takes it; `NServiceBus.DeliverAt` says a minute later (the
    sender's clock ahead of the database's), and must not delay it again."""
    queue = rabbitmq_queues("Billing")
    config = tmp_path / "routes.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            connections:
              pg: {{type: postgresql, dsn: "{pg_dsn}", schema: {pg_schema}}}
              rabbit: {{type: rabbitmq, url: "{rabbitmq_url}", topology: direct}}
            routes:
              - name: sales-to-billing
                from: {{connection: pg, queue: Sales}}
                to: {{connection: rabbit, queue: "{queue}"}}
            """
        )
    )
    loaded = load_config(config).config
    pg = load("pg", loaded.connections["pg"])
    rabbit = load("rabbit", loaded.connections["rabbit"])
    assert isinstance(pg, SqlTransport)
    try:
        await pg.install(["Sales", "Other"])
        await rabbit.install([queue])
    finally:
        await rabbit.close()
    delayed = pg.dialect.delayed_statements("Sales")
    due_in_ms = 1500
    due = time.time() + due_in_ms / 1000
    deliver_at = format_timestamp(datetime.fromtimestamp(due + 60, UTC))
    rows = []
    for message_id, forward in (("to-billing", "Sales"), ("to-other", "Other")):
        headers = Headers(
            [
                ("NServiceBus.MessageId", message_id),
                ("NServiceBus.DeliverAt", deliver_at),
                ("NServiceBus.EnclosedMessageTypes", "Sales.OrderBilled"),
            ]
        )
        rows.append(
            store_params(pg.dialect, Envelope(headers, b"{}"), due_in_ms, forward, time.time())
        )
    with psycopg.connect(pg_dsn) as db:
        db.cursor().executemany(delayed.store, rows)
    process = BridgeProcess(config, "run").start()
    try:
        arrivals = await asyncio.to_thread(rabbit_arrivals, rabbitmq_url, queue, due + 10)
        process.stop()
        other = await drain(pg, "Other")
        left = await pg.peek("Sales")
    finally:
        process.kill()
        await pg.close()
    assert [p.message_id for _, p in arrivals] == ["to-billing"], process.output()
    arrived, properties = arrivals[0]
    lateness = arrived - due
    print(f"\nNServiceBus delayed message PostgreSQL -> RabbitMQ: {lateness:+.2f} s after due")
    assert 0 <= lateness < 2.5, f"{lateness:.2f} s after it was due: delayed again?"
    headers = properties.headers or {}
    assert headers["NServiceBus.DeliverAt"] == deliver_at  # information only, carried on
    assert FORWARD_DESTINATION not in headers  # stripped, as the receiver strips it
    (forwarded,) = other
    assert forwarded.message_id == "to-other"
    assert FORWARD_DESTINATION not in forwarded.headers
    assert (left.depth, left.delayed) == (0, 0)


def test_send_delay_to_kafka_without_a_delays_connection_exits_2_with_the_reason(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    import subprocess
    import sys

    config = tmp_path / "routes.yaml"
    config.write_text(
        f'connections:\n  kafka: {{type: kafka, bootstrap_servers: "{kafka_bootstrap}"}}\n'
        "routes: []\n"
    )
    command = [sys.executable, "-m", "bridge", "send", "kafka", "t", "--delay", "1.00:00:00"]
    result = subprocess.run(
        [*command, "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "connection 'kafka' (kafka) cannot hold a delayed message, and the config names no " in (
        result.stderr
    )


async def test_a_delay_with_a_time_to_live_is_refused_and_peek_shows_what_waits(
    tmp_path: Path,
) -> None:
    """NServiceBus refuses a delayed message with a time to be received (it could expire while
    it waits); `peek` shows the delayed messages waiting and when the next is due."""
    from bridge.commands import describe_stats
    from bridge.config.models import SqliteConnection
    from bridge.errors import MessageRejected

    transport = load("db", SqliteConnection(type="sqlite", path=str(tmp_path / "q.db")))
    try:
        await transport.install(["Out"])
        sink = transport.sink("Out")
        now = time.time()
        later = Envelope(Headers([("NServiceBus.MessageId", "later")]), b"{}", deliver_at=now + 60)
        expiring = Envelope(Headers(), b"{}", expires_at=now + 600, deliver_at=now + 60)
        with pytest.raises(MessageRejected, match="NServiceBus refuses postponed") as refused:
            await sink.send([later, expiring])
        assert refused.value.index == 1
        await sink.send([later])
        await sink.close()
        stats = await transport.peek("Out")
    finally:
        await transport.close()
    assert (stats.depth, stats.delayed) == (0, 1)
    assert stats.next_due_seconds is not None and 58 < stats.next_due_seconds <= 60
    text = describe_stats("db", "Out", stats, as_json=False)
    assert text.endswith(f"  delayed: 1\n  next due: in {stats.next_due_seconds:.1f} s")


class Refusing:
    """A sink that refuses the message with id `refused` (as Kafka refuses a record too
    large), and keeps the others (`whole`: a send that refuses one keeps none, and the
    producer sends the others again)."""

    def __init__(self, refused: str = "refused", whole: bool = False) -> None:
        self.refused = refused
        self.whole = whole
        self.sent: list[str] = []
        self.later = asyncio.Event()

    async def send(self, envelopes: Any, checkpoint: Any = None) -> None:
        from bridge.errors import MessageRejected

        for index, envelope in enumerate(envelopes):
            if envelope.message_id == self.refused:
                raise MessageRejected("too large", index=index)
            if not self.whole:
                self.took(envelope)
        for envelope in envelopes if self.whole else ():
            self.took(envelope)

    def took(self, envelope: Envelope) -> None:
        self.sent.append(envelope.message_id)
        if envelope.message_id == "later":
            self.later.set()

    async def close(self) -> None:
        pass


def kafka_delayed_on_sqlite(tmp_path: Path) -> tuple[Any, SqlTransport]:
    """A config whose Kafka connection's delays wait in SQLite (`delays:`), and that SQLite
    transport; the Kafka broker is never reached."""
    from bridge.config.models import BridgeConfig

    config = BridgeConfig.model_validate(
        {
            "connections": {
                "lite": {"type": "sqlite", "path": str(tmp_path / "q.db")},
                "kafka": {"type": "kafka", "bootstrap_servers": "127.0.0.1:1"},
            },
            "delays": {"connection": "lite"},
        }
    )
    lite = load("lite", config.connections["lite"])
    assert isinstance(lite, SqlTransport)
    return config, lite


async def test_delays_for_a_destination_that_cannot_delay_wait_in_bridgedelays(
    tmp_path: Path,
) -> None:
    """`delays:`: a send's messages due later are stored in BridgeDelays, the others go on at
    once, and a refusal names the message by its place in the whole send; the producer sends
    the stored ones when due, and deletes them."""
    from bridge.errors import MessageRejected
    from bridge.service.delaying import DelayedProducer, delaying_sink

    config, lite = kafka_delayed_on_sqlite(tmp_path)
    inner = Refusing()
    sink = delaying_sink(config, "kafka", "topic", None, inner, lambda name: lite)
    stopping = asyncio.Event()
    try:
        await lite.install_delay_table()
        due = time.time() + 1.0

        def message(message_id: str, deliver_at: float | None = None) -> Envelope:
            headers = Headers([("NServiceBus.MessageId", message_id)])
            return Envelope(headers, b"{}", deliver_at=deliver_at)

        with pytest.raises(MessageRejected) as refused:
            await sink.send([message("later", due), message("now"), message("refused")])
        assert refused.value.index == 2  # its place in the send, not among those sent on
        # The runner sends the rest again, the delayed message with it: stored once.
        await sink.send([message("later", due), message("now")])
        with sqlite3.connect(tmp_path / "q.db") as db:
            assert db.execute('SELECT count(*) FROM "BridgeDelays"').fetchone() == (1,)
        assert inner.sent == ["now", "now"]
        producer = DelayedProducer(lite, lambda connection, address, key: inner)
        running = asyncio.create_task(producer.run(stopping))
        await asyncio.wait_for(inner.later.wait(), timeout=10)
        arrived = time.time()
        stopping.set()
        await running
    finally:
        stopping.set()
        await sink.close()
        await lite.close()
    assert inner.sent == ["now", "now", "later"]
    assert 0 <= arrived - due < 1.5
    with sqlite3.connect(tmp_path / "q.db") as db:
        assert db.execute('SELECT count(*) FROM "BridgeDelays"').fetchone() == (0,)


async def test_a_forward_destination_that_does_not_exist_is_a_poison_message(
    tmp_path: Path,
) -> None:
    """NServiceBus fails a message whose ForwardDestination table does not exist
    (ProcessStrategy.cs:104-121: QueueNotFoundException); the bridge sends it to the error
    queue with the reason, and takes the rows around it as usual."""
    from bridge.config.models import SqliteConnection

    transport = load("db", SqliteConnection(type="sqlite", path=str(tmp_path / "q.db")))
    try:
        await transport.install(["In", "err"])
        sink = transport.sink("In")
        await sink.send(
            [
                Envelope(Headers([("NServiceBus.MessageId", "a")]), b"{}"),
                Envelope(
                    Headers(
                        [("NServiceBus.MessageId", "b"), (FORWARD_DESTINATION, '"main"."Nowhere"')]
                    ),
                    b"{}",
                ),
                Envelope(
                    Headers([("NServiceBus.MessageId", "c"), (FORWARD_DESTINATION, '"main"."In"')]),
                    b"{}",
                ),
            ]
        )
        await sink.close()
        source = transport.source("In", error_queue="err")
        batch = await source.receive_batch(10, 1.0)
        async with batch:
            taken = [(e.message_id, FORWARD_DESTINATION in e.headers) for e in batch.messages]
            (poison,) = batch.poison
            await batch.commit()
        await source.close()
        errors = await drain(transport, "err")
    finally:
        await transport.close()
    assert taken == [("a", False), ("c", False)]
    assert 'NServiceBus.SqlServer.ForwardDestination \'"main"."Nowhere"\' does not exist' in (
        poison.reason
    )
    (copy,) = errors  # an error copy with readable headers (a retry of it crosses)
    assert copy.message_id == "b" and FORWARD_DESTINATION not in copy.headers
    assert "does not exist" in (copy.headers.get("NServiceBus.ExceptionInfo.Message") or "")


def test_check_connect_finds_bridgedelays_on_the_delays_connection(tmp_path: Path) -> None:
    import subprocess
    import sys

    config = tmp_path / "routes.yaml"
    config.write_text(
        f'connections:\n  lite: {{type: sqlite, path: "{tmp_path / "q.db"}"}}\n'
        "routes: []\ndelays: {connection: lite}\n"
    )

    def bridge(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "bridge", *args, "-c", str(config)]
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    sqlite3.connect(tmp_path / "q.db").close()  # the file, without the table
    missing = bridge("check", "--connect")
    assert missing.returncode == 1, missing.stderr
    assert "lite: FAILED: sqlite connection 'lite': table \"BridgeDelays\", where delays wait" in (
        missing.stdout
    )
    assert bridge("install").returncode == 0
    found = bridge("check", "--connect")
    assert found.returncode == 0, found.stdout
    assert "lite: OK (BridgeDelays, bridge.error)" in found.stdout
    with sqlite3.connect(tmp_path / "q.db") as db:
        db.execute('DROP TABLE "bridge.error"')
    missing = bridge("check", "--connect")
    assert missing.returncode == 1, missing.stderr
    assert (
        "lite: FAILED: sqlite connection 'lite': table \"bridge.error\", where delayed messages "
        "that can never be sent go, does not exist (run `bridge install`)"
    ) in missing.stdout


async def test_a_delayed_message_that_can_never_be_sent_goes_to_the_error_queue(
    tmp_path: Path,
) -> None:
    """A row of BridgeDelays its destination refuses for good (a record too large), or whose
    Headers column cannot be read, goes to the `delays:` connection's error queue (`bridge.error`)
    with the reason in its headers, and its row is deleted; the rows due with it or after it,
    for its destination and others, go out once each."""
    from bridge.service.delaying import DelayedProducer, delaying_sink

    config, lite = kafka_delayed_on_sqlite(tmp_path)
    inner = Refusing()
    stopping = asyncio.Event()
    try:
        await lite.install_delay_table()
        due = time.time() + 0.5
        for topic, message_id in (("a", "good"), ("b", "refused"), ("a", "broken"), ("a", "later")):
            sink = delaying_sink(config, "kafka", topic, None, inner, lambda name: lite)
            headers = Headers([("NServiceBus.MessageId", message_id), ("trace", "x")])
            await sink.send([Envelope(headers, b"{}", deliver_at=due)])
            due += 0.2
        with sqlite3.connect(tmp_path / "q.db") as db:
            db.execute(
                'UPDATE "BridgeDelays" SET Headers = \'[["NServiceBus.MessageId",\' '
                "WHERE Headers LIKE '%broken%'"
            )
        producer = DelayedProducer(lite, lambda connection, address, key: inner)
        running = asyncio.create_task(producer.run(stopping))
        await asyncio.wait_for(inner.later.wait(), timeout=10)
        await asyncio.sleep(1.0)  # time to send anything again, were it to
        stopping.set()
        await running
    finally:
        stopping.set()
        await lite.close()
    assert inner.sent == ["good", "later"]
    with sqlite3.connect(tmp_path / "q.db") as db:
        assert db.execute('SELECT count(*) FROM "BridgeDelays"').fetchone() == (0,)
        copies = [
            headers_codec.decode(row[0])
            for row in db.execute('SELECT headers FROM "bridge.error" ORDER BY seq')
        ]
    refused, broken = copies
    assert refused.get("NServiceBus.MessageId") == "refused"
    assert refused.get("trace") == "x"
    # No route on `lite` leads to topic b: a table named like it, in its canonical form (a
    # retry fails at ServiceControl until someone adds that table and a route from it).
    assert refused.get("NServiceBus.FailedQ") == '"main"."b"'
    assert refused.get("NServiceBus.Bridge.Destination") == "kafka/b"
    reason = refused.get("NServiceBus.ExceptionInfo.Message") or ""
    assert reason.startswith("the delayed message (BridgeDelays row ")
    assert reason.endswith(") to kafka/b can never be sent: too large")
    assert broken.get("NServiceBus.FailedQ") == '"main"."a"'
    assert broken.get("NServiceBus.Bridge.RawHeaders") == '[["NServiceBus.MessageId",'
    assert broken.get("NServiceBus.ExceptionInfo.ExceptionType") == "HeadersFormatError"


async def test_a_forward_destination_in_another_schema_gets_the_message_there(
    tmp_path: Path, pg_dsn: str, pg_schema: str
) -> None:
    """NServiceBus's receiver sends a forwarded message to whatever queue its
    ForwardDestination names, schema-qualified ones included (Sql.Shared/Receiving/
    ProcessStrategy.cs:101-104: `tableBasedQueueCache.Get(forwardDestination)`, the address
    translated with its schema, PostgreSql/Addressing/QueueAddressTranslator.cs:31-45): a row
    of PostgreSQL `In` naming `"sales"."Billing"` goes to that table, in the receive's
    transaction. One naming a table that does not exist there is a poison message. SQLite
    reaches only `main`: another schema is a poison message, with the reason."""
    from bridge.config.models import BridgeConfig

    sales = unique("sales")
    with psycopg.connect(pg_dsn, autocommit=True) as db:
        db.execute(f'CREATE SCHEMA "{sales}"')
    try:
        config = BridgeConfig.model_validate(
            {
                "connections": {
                    "pg": sql_connection("postgresql", tmp_path, pg_dsn, pg_schema),
                    "sales": sql_connection("postgresql", tmp_path, pg_dsn, sales),
                    "lite": sql_connection("sqlite", tmp_path, pg_dsn, pg_schema),
                }
            }
        )
        pg, there, lite = (load(name, config.connections[name]) for name in config.connections)
        forwards = {
            "pg": [
                ("billing", f'"{sales}"."Billing"'),
                ("nowhere", f'"{sales}"."Nowhere"'),
                ("own", f'"{pg_schema}"."In"'),
            ],
            "lite": [("other", '"sales"."Billing"'), ("own", '"main"."In"')],
        }
        taken: dict[str, list[str | None]] = {}
        poison: dict[str, list[tuple[str | None, str]]] = {}
        try:
            await there.install(["Billing"])
            for name, transport in (("pg", pg), ("lite", lite)):
                await transport.install(["In", "err"])
                sink = transport.sink("In")
                await sink.send(
                    [
                        Envelope(
                            Headers([("NServiceBus.MessageId", i), (FORWARD_DESTINATION, to)]),
                            b"{}",
                        )
                        for i, to in forwards[name]
                    ]
                )
                await sink.close()
                source = transport.source("In", error_queue="err")
                batch = await source.receive_batch(10, 1.0)
                async with batch:
                    taken[name] = [e.message_id for e in batch.messages]
                    poison[name] = [
                        (p.headers.get("NServiceBus.MessageId"), p.reason) for p in batch.poison
                    ]
                    await batch.commit()
                await source.close()
            billing = await drain(there, "Billing")
        finally:
            for transport in (pg, there, lite):
                await transport.close()
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as db:
            db.execute(f'DROP SCHEMA "{sales}" CASCADE')
    assert [e.message_id for e in billing] == ["billing"]
    assert FORWARD_DESTINATION not in billing[0].headers
    assert taken == {"pg": ["own"], "lite": ["own"]}
    ((nowhere, reason),) = poison["pg"]
    assert nowhere == "nowhere" and "does not exist" in reason
    ((other, reason),) = poison["lite"]
    assert other == "other" and "SQLite" in reason and "main" in reason


def nginn_postgresql(pg_dsn: str, pg_schema: str) -> SqlTransport:
    from bridge.transports.sql.config import PostgresConnection

    config = PostgresConnection.model_validate(
        {
            "type": "postgresql",
            "dsn": pg_dsn,
            "schema": pg_schema,
            "layout": "nginn",
            "nginn": {"alias": "ng", "timezone": "UTC", "retries": True},
        }
    )
    transport = load("ng", config)
    assert isinstance(transport, SqlTransport)
    return transport


async def moves_while_a_due_r_row_is_held(
    transport: SqlTransport, pg_dsn: str, pg_schema: str, seconds: float
) -> int:
    """Rounds a mover of NGinn table `Q` runs in `seconds` while its only `R` row, due, is
    held (FOR UPDATE) by another transaction."""
    holder = psycopg.connect(pg_dsn)
    stopping = asyncio.Event()
    try:
        await transport.install(["Q"])
        holder.execute(
            f'INSERT INTO "{pg_schema}"."Q" (from_endpoint, to_endpoint, subqueue, insert_time, '
            "retry_count, retry_time, msg_text, msg_headers) VALUES ('a', 'sql://ng/Q', 'R', "
            "now() AT TIME ZONE 'UTC', 0, now() AT TIME ZONE 'UTC' - interval '1 s', '{}', '')"
        )
        holder.commit()
        holder.execute(f'SELECT id FROM "{pg_schema}"."Q" FOR UPDATE').fetchall()
        mover = DelayedMover(transport, "Q")
        running = asyncio.create_task(mover.run(stopping))
        await asyncio.sleep(seconds)
        stopping.set()
        await running
        return mover.moves
    finally:
        stopping.set()
        holder.rollback()
        holder.close()
        await transport.close()


async def test_an_nginn_postgresql_mover_waits_while_the_due_r_row_is_held_by_another(
    pg_dsn: str, pg_schema: str
) -> None:
    """The NGinn mover takes `R` rows FOR UPDATE SKIP LOCKED, and reads the next due time
    skipping them alike: a due `R` row another transaction holds is not due for this mover,
    which waits `MAX_WAIT` between looks instead of looking again at once (thousands of rounds
    a second), as the BridgeDelays producer waits
    (test_bridge_delays_producer.py)."""
    transport = nginn_postgresql(pg_dsn, pg_schema)
    moves = await moves_while_a_due_r_row_is_held(transport, pg_dsn, pg_schema, 2.5 * MAX_WAIT)
    assert moves <= 4, f"{moves} moves in {2.5 * MAX_WAIT:.1f} s: the mover polls in a loop"


async def test_a_mover_that_sees_due_rows_it_cannot_take_waits_between_looks(
    pg_dsn: str, pg_schema: str
) -> None:
    """A look that sees rows another transaction holds (as SQL Server's READPAST sees rows
    under another's update lock), here NGinn's next due time read without skipping them: each
    move finds a row due and moves none, and the mover waits `MIN_WAIT`, doubled each time,
    up to `MAX_WAIT`, instead of moving again at once."""
    from dataclasses import replace

    transport = nginn_postgresql(pg_dsn, pg_schema)
    dialect = transport.dialect
    looks_at_held_rows = replace(
        dialect.delayed_statements("Q"),
        next_due=(
            "SELECT EXTRACT(EPOCH FROM min(retry_time) - (now() AT TIME ZONE 'UTC')) "
            f'FROM "{pg_schema}"."Q" WHERE subqueue = \'R\''
        ),
    )
    dialect.delayed_statements = lambda address: looks_at_held_rows  # type: ignore[method-assign]
    seconds = 2.5 * MAX_WAIT
    moves = await moves_while_a_due_r_row_is_held(transport, pg_dsn, pg_schema, seconds)
    # MIN_WAIT 0.05 s doubled: 0.05 + 0.1 + 0.2 + 0.4 + 0.8 + 1.0 > 2.5 s, six waits.
    assert MIN_WAIT == 0.05
    assert moves <= 8, f"{moves} moves in {seconds:.1f} s: the mover polls in a loop"


LONG_ID = "x" * 41  # longer than NGinn's unique_id (40 characters), fine for Kafka


def nginn_delays_on_sqlite(tmp_path: Path) -> tuple[Any, SqlTransport]:
    """As `kafka_delayed_on_sqlite`, its `delays:` connection of NGinn tables."""
    from bridge.config.models import BridgeConfig

    config = BridgeConfig.model_validate(
        {
            "connections": {
                "lite": {
                    "type": "sqlite",
                    "path": str(tmp_path / "q.db"),
                    "layout": "nginn",
                    "nginn": {"alias": "ng", "timezone": "UTC"},
                },
                "kafka": {"type": "kafka", "bootstrap_servers": "127.0.0.1:1"},
            },
            "delays": {"connection": "lite"},
        }
    )
    lite = load("lite", config.connections["lite"])
    assert isinstance(lite, SqlTransport)
    return config, lite


@pytest.mark.parametrize("case", ["error queue missing", "nginn copy too long"])
async def test_a_refused_row_whose_error_copy_cannot_be_written_never_sends_the_others_again(
    tmp_path: Path, case: str
) -> None:
    """The rows sent are deleted whatever becomes of the error copy of a row refused for good
    with them: a copy that cannot be written (the error queue's table dropped; an NGinn error
    queue, whose unique_id holds 40 characters, nginn_outgoing.py `outgoing`) leaves the refused
    row in BridgeDelays, put off by `PUT_OFF` seconds and counted, and the good row goes out
    once (before: the whole settle rolled back, the good row was sent again at each take)."""
    from bridge.service.delaying import DelayedProducer, delaying_sink
    from bridge.transports.sql.delay_table import PUT_OFF

    if case == "error queue missing":
        config, lite = kafka_delayed_on_sqlite(tmp_path)
        refused_id = "refused"
    else:
        config, lite = nginn_delays_on_sqlite(tmp_path)
        refused_id = LONG_ID
    inner = Refusing(refused_id, whole=True)
    stopping = asyncio.Event()
    try:
        await lite.install_delay_table()
        if case == "error queue missing":
            with sqlite3.connect(tmp_path / "q.db") as db:
                db.execute('DROP TABLE "bridge.error"')
        due = time.time() + 0.3
        sink = delaying_sink(config, "kafka", "a", None, inner, lambda name: lite)
        for message_id in ("good", refused_id):
            headers = Headers([("NServiceBus.MessageId", message_id)])
            await sink.send([Envelope(headers, b"{}", deliver_at=due)])
        producer = DelayedProducer(lite, lambda connection, address, key: inner)
        running = asyncio.create_task(producer.run(stopping))
        await asyncio.sleep(3.0)  # time to send the good row again, were it to
        stopping.set()
        await running
    finally:
        stopping.set()
        await lite.close()
    assert inner.sent == ["good"]
    assert producer.uncopied == 1
    with sqlite3.connect(tmp_path / "q.db") as db:
        (waiting,) = db.execute(
            "SELECT Headers, (julianday(Due) - julianday('now')) * 86400.0 FROM \"BridgeDelays\""
        ).fetchall()
    assert refused_id in waiting[0]
    assert PUT_OFF - 10 < waiting[1] <= PUT_OFF


def test_check_connect_warns_of_a_missing_delayed_table_of_a_destination_of_kafka(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    """A route from Kafka may bring delayed messages (the record's delay header) to a SQL
    table, which wait in its delayed table: `check --connect` warns while that table is
    missing (a delayed message to it would go to the error queue), saying who creates it."""
    from tests.support.cli import run_bridge

    topic = unique("in")
    config = tmp_path / "routes.yaml"
    config.write_text(
        "connections:\n"
        f'  lite: {{type: sqlite, path: "{tmp_path / "q.db"}"}}\n'
        f'  kafka: {{type: kafka, bootstrap_servers: "{kafka_bootstrap}"}}\n'
        "routes:\n"
        f"  - {{name: in, from: {{connection: kafka, topic: {topic}, group: g}}, "
        "to: {connection: lite, queue: Out}}\n"
    )
    run_bridge("install", config=config)
    assert run_bridge("check", "--connect", config=config).returncode == 0
    with sqlite3.connect(tmp_path / "q.db") as db:
        db.execute('DROP TABLE "Out.Delayed"')
    missing = run_bridge("check", "--connect", config=config)
    assert (
        'lite: warning: delayed table "Out.Delayed", where delayed messages to its queue '
        "would wait (its routes come from Kafka, whose records may ask for a delay), does not "
        f"exist: such a message goes to the error queue. {MISSING_DELAYED_TABLE}"
    ) in missing.stdout


async def test_a_delayed_message_without_its_delayed_table_is_refused_alone(
    tmp_path: Path,
) -> None:
    """A delayed message to a table whose delayed table is missing is refused by its index
    (the runner sends it to the error queue with the reason, and the rest of the batch on),
    not a TransportError ("no such table") that fails the whole batch again and again."""
    from bridge.config.models import SqliteConnection
    from bridge.errors import MessageRejected

    transport = load("lite", SqliteConnection(type="sqlite", path=str(tmp_path / "q.db")))
    try:
        await transport.install(["Out"])
        with sqlite3.connect(tmp_path / "q.db") as db:
            db.execute('DROP TABLE "Out.Delayed"')
        sink = transport.sink("Out")

        def message(message_id: str, deliver_at: float | None = None) -> Envelope:
            headers = Headers([("NServiceBus.MessageId", message_id)])
            return Envelope(headers, b"{}", deliver_at=deliver_at)

        batch = [message("a"), message("later", time.time() + 60), message("b")]
        with pytest.raises(MessageRejected) as refused:
            await sink.send(batch)
        await sink.send([batch[0], batch[2]])  # the rest, as the runner sends it
        await sink.close()
        arrived = [e.message_id for e in await drain(transport, "Out")]
    finally:
        await transport.close()
    assert refused.value.index == 1
    assert str(refused.value) == (
        "sqlite connection 'lite': table 'Out': its delayed table \"Out.Delayed\", where a "
        f"delayed message waits, does not exist ({MISSING_DELAYED_TABLE})"
    )
    assert arrived == ["a", "b"]


async def test_an_error_copy_of_a_delayed_message_names_the_proxy_that_leads_to_its_topic(
    tmp_path: Path,
) -> None:
    """ServicePulse's retry sends a copy to its FailedQ on the transport where it found it:
    the `delays:` connection. The copy of a row for endpoint Billing's topic (billing-in)
    names Billing's
    proxy on that connection, which the registry's route forwards to the topic: a retry
    crosses to Kafka again (not an insert into a table named like the topic, which does not
    exist). The topic is in `NServiceBus.Bridge.Destination`."""
    from bridge.config.models import BridgeConfig
    from bridge.service.delaying import DelayedProducer, delaying_sink, retry_queues

    config = BridgeConfig.model_validate(
        {
            "connections": {
                "lite": {"type": "sqlite", "path": str(tmp_path / "q.db")},
                "kafka": {"type": "kafka", "bootstrap_servers": "127.0.0.1:1"},
            },
            "endpoints": {"Billing": {"connection": "kafka", "queue": "billing-in"}},
            "delays": {"connection": "lite"},
        }
    )
    lite = load("lite", config.connections["lite"])
    assert isinstance(lite, SqlTransport)
    proxied = "billing-in"  # the endpoint's topic; its proxy on `lite` is table Billing
    assert retry_queues(config) == {("kafka", proxied): "Billing"}
    inner = Refusing("refused", whole=True)
    stopping = asyncio.Event()
    try:
        await lite.install_delay_table()
        sink = delaying_sink(config, "kafka", proxied, None, inner, lambda name: lite)
        headers = Headers([("NServiceBus.MessageId", "refused")])
        await sink.send([Envelope(headers, b"{}", deliver_at=time.time() + 0.2)])
        producer = DelayedProducer(
            lite, lambda connection, address, key: inner, retry_to=retry_queues(config)
        )
        running = asyncio.create_task(producer.run(stopping))
        for _ in range(100):
            copies = await drain(lite, "bridge.error")
            if copies:
                break
            await asyncio.sleep(0.05)
        stopping.set()
        await running
    finally:
        stopping.set()
        await lite.close()
    (copy,) = copies
    assert copy.headers.get("NServiceBus.FailedQ") == '"main"."Billing"'
    assert copy.headers.get("NServiceBus.Bridge.Destination") == f"kafka/{proxied}"
