"""`bridge migrate` with Kafka on either side, on the local broker: PostgreSQL -> Kafka (read
back with a plain consumer), and Kafka -> PostgreSQL exactly-once (a retried task, a second
run, the service resuming from the positions the job stored, and two attempts of one
partition at the same time).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bridge.config.loader import load_config
from bridge.envelope import Envelope
from bridge.errors import MessageRejected
from bridge.migrate.bounded import run_until_exhausted
from bridge.migrate.driver import migrate
from bridge.migrate.kafkatask import RangeTakenOver, move_partition
from bridge.migrate.spec import FAIL_AFTER_ENV, JobSpec
from bridge.nservicebus.wireformat import format_timestamp
from bridge.protocols import Transport
from bridge.transports import load
from bridge.transports.kafka import Transport as KafkaTransport
from bridge.transports.kafka.headers import EXPIRES_AT
from tests.conftest import unique
from tests.spark.conftest import write_routes
from tests.spark.data import by_id, message, pg_insert_raw, pg_poison_raw_headers, pg_rows
from tests.support.faultproxy import FaultProxy
from tests.support.wire import POSTGRES, postgres_commit

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class Setup:
    def __init__(self, tmp_path: Path, pg_dsn: str, schema: str, kafka: str) -> None:
        self.pg_dsn, self.schema, self.kafka = pg_dsn, schema, kafka
        self.queue, self.topic = unique("Orders"), unique("orders")
        self.group, self.errors = unique("group"), unique("errors")
        self.config = write_routes(
            tmp_path / "routes.yaml",
            f"""
            shop: {{type: postgresql, dsn: "{pg_dsn}", schema: "{schema}"}}
            kafka: {{type: kafka, bootstrap_servers: "{kafka}", idempotence: false,
                     partitions: 3}}
            """,
            f"""
            - name: to-kafka
              from: {{connection: shop, queue: "{self.queue}"}}
              to: {{connection: kafka, topic: "{self.topic}"}}
            - name: from-kafka
              from: {{connection: kafka, topic: "{self.topic}", group: "{self.group}"}}
              to: {{connection: shop, queue: "{self.queue}"}}
              error_queue: "{self.errors}"
              batch_size: 40
            """,
        )

    def transport(self, name: str) -> Transport:
        return load(name, load_config(self.config).config.connections[name])

    async def install(self) -> None:
        for name, addresses in (
            ("shop", [self.queue, "bridge.error"]),
            ("kafka", [self.topic, self.errors]),
        ):
            transport = self.transport(name)
            await transport.install(addresses)
            await transport.close()

    async def read(self, topic: str) -> list[Any]:
        """Every record of `topic`, partition by partition."""
        consumer = AIOKafkaConsumer(bootstrap_servers=self.kafka, enable_auto_commit=False)
        await consumer.start()
        try:
            await consumer.topics()
            tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            end = await consumer.end_offsets(tps)
            records: list[Any] = []
            deadline = time.monotonic() + 30
            while [tp for tp in tps if await consumer.position(tp) < end[tp]]:
                assert time.monotonic() < deadline, "records missing from the topic"
                for batch in (await consumer.getmany(timeout_ms=500)).values():
                    records.extend(batch)
            # tansu gives a partition's end as its last record batch's first offset + 1, so
            # the rest of that batch can still be to come: read until a fetch finds nothing.
            while fetched := await consumer.getmany(timeout_ms=500):
                for batch in fetched.values():
                    records.extend(batch)
            return records
        finally:
            await consumer.stop()

    async def produce(self, records: Sequence[tuple[Envelope, int, int | None]]) -> dict[int, int]:
        """Write (envelope, partition, timestamp) records as a foreign producer would;
        returns the end offset of each partition."""
        producer = AIOKafkaProducer(bootstrap_servers=self.kafka, enable_idempotence=False)
        await producer.start()
        try:
            end: dict[int, int] = {}
            for envelope, partition, stamp in records:
                headers = [(k, None if v is None else v.encode()) for k, v in envelope.headers]
                sent = await producer.send_and_wait(
                    self.topic,
                    envelope.body,
                    key=str(envelope.message_id).encode(),
                    headers=headers,
                    partition=partition,
                    timestamp_ms=stamp,
                )
                end[partition] = sent.offset + 1
            return end
        finally:
            await producer.stop()

    def checkpoints(self) -> dict[str, int]:
        with psycopg.connect(self.pg_dsn) as db:
            rows = db.execute(
                f'SELECT name, position FROM "{self.schema}"."BridgeCheckpoints"'
            ).fetchall()
        return {str(name): int(position) for name, position in rows}


#: Attempts at the PostgreSQL -> Kafka migration below. The local broker (tansu, memory
#: storage) sometimes loses records that it acknowledged when two producers append to one
#: partition at the same time (`bench/tansu_producers.py`: 16 of 20,000 in one run of four),
#: and two Spark tasks are two producers. A run whose records the bridge saw acknowledged
#: (the job's summary) but the topic lacks is that, and is run again on a fresh table and topic;
#: anything else fails at once.
BROKER_LOSS_ATTEMPTS = 4


async def test_postgresql_to_kafka_carries_every_header_and_body(
    spark: Any, tmp_path: Path, pg_dsn: str, pg_schema: str, kafka_bootstrap: str
) -> None:
    for attempt in range(1, BROKER_LOSS_ATTEMPTS + 1):
        home = tmp_path / f"attempt-{attempt}"
        home.mkdir()
        setup = Setup(home, pg_dsn, pg_schema, kafka_bootstrap)
        records, sent = await _migrate_to_kafka(setup, pg_dsn, pg_schema)
        if len(records) == len(sent) or attempt == BROKER_LOSS_ATTEMPTS:
            break
        got = {r.key.decode() for r in records}
        assert got < {str(e.message_id) for e in sent}, "records the job never sent"
        print(f"attempt {attempt}: the broker lost {len(sent) - len(records)} acknowledged records")
    assert len(records) == 2000
    got_by_key = {r.key.decode(): r for r in records}
    for envelope in sent:
        record = got_by_key[str(envelope.message_id)]
        headers = [(k, None if v is None else v.decode()) for k, v in record.headers]
        assert headers == list(envelope.headers)
        assert record.value == envelope.body


async def _migrate_to_kafka(
    setup: Setup, pg_dsn: str, pg_schema: str
) -> tuple[list[Any], list[Envelope]]:
    """Fill the queue (2,000 messages, 7 expired, a poison row), migrate it to Kafka, check the
    job's account of it and the table; the topic's records and the messages sent."""
    await setup.install()
    shop = setup.transport("shop")
    sink = shop.sink(setup.queue)
    sent = [message(n) for n in range(2000)]
    await sink.send(sent[:1000])
    pg_insert_raw(pg_dsn, pg_schema, setup.queue, "[1, 2]", b"poison")
    await sink.send(sent[1000:] + [message(5000 + n, ttl=-1) for n in range(7)])
    await shop.close()
    poison_before = len(pg_poison_raw_headers(pg_dsn, pg_schema))

    summary = await migrate(
        JobSpec.from_file(str(setup.config), "to-kafka"), master=None, partitions=5
    )

    assert (summary.moved.moved, summary.moved.expired, summary.moved.poison) == (2000, 7, 1)
    assert pg_rows(pg_dsn, pg_schema, setup.queue) == []
    assert pg_poison_raw_headers(pg_dsn, pg_schema)[poison_before:] == ["[1, 2]"]
    return await setup.read(setup.topic), sent


async def test_kafka_to_postgresql_is_exactly_once_and_the_service_resumes(
    spark: Any,
    tmp_path: Path,
    pg_dsn: str,
    pg_schema: str,
    kafka_bootstrap: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup = Setup(tmp_path, pg_dsn, pg_schema, kafka_bootstrap)
    await setup.install()
    live = [message(n) for n in range(1500)]
    an_hour_ago = int((time.time() - 3600) * 1000)
    stale = message(9000)  # its deadline, the header the bridge writes, passed an hour ago
    stale.headers.set("NServiceBus.TimeToBeReceived", "00:01:00")
    stale.headers.set(EXPIRES_AT, format_timestamp(datetime.fromtimestamp(an_hour_ago / 1000, UTC)))
    records = [(m, n % 3, None) for n, m in enumerate(live)] + [(stale, 1, an_hour_ago)]
    end = await setup.produce(records)
    poisoned = await _produce_poison(setup, partition=2)
    end[2] = poisoned

    monkeypatch.setenv(FAIL_AFTER_ENV, "3")  # the first task dies once, after a stored batch
    spec = JobSpec.from_file(str(setup.config), "from-kafka")
    summary = await migrate(spec, master=None)

    assert summary.retried_tasks == 1 and summary.tasks == 3
    assert (summary.moved.expired, summary.moved.poison) == (1, 1)
    # With what the failed attempt stored before it failed: 1502 offsets, less the two above.
    assert (summary.planned, summary.moved.moved, summary.left) == (1502, 1500, 0)
    rows = pg_rows(pg_dsn, pg_schema, setup.queue)
    assert len(rows) == 1500  # nothing twice, even after the retry
    got = by_id(rows)
    for envelope in live:
        assert got[str(envelope.message_id)] == (envelope.headers, envelope.body)
    assert setup.checkpoints() == {f"{setup.group}/{setup.topic}/{p}": end[p] for p in range(3)}
    copies = await setup.read(setup.errors)
    assert len(copies) == 1 and copies[0].value == b"poison"

    monkeypatch.delenv(FAIL_AFTER_ENV)
    again = await migrate(JobSpec.from_file(str(setup.config), "from-kafka"), master=None)
    assert (again.planned, again.moved.moved, again.tasks) == (0, 0, 0)
    assert len(pg_rows(pg_dsn, pg_schema, setup.queue)) == 1500

    more = [message(20_000 + n) for n in range(10)]
    await setup.produce([(m, n % 3, None) for n, m in enumerate(more)])
    service = await asyncio.to_thread(
        subprocess.run,
        [
            *(sys.executable, "-m", "bridge", "run", "--route", "from-kafka"),
            *("--until-idle", "2", "-c", str(setup.config), "--log-level", "WARNING"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert service.returncode == 0, service.stderr
    rows = pg_rows(pg_dsn, pg_schema, setup.queue)
    assert len(rows) == 1510 and by_id(rows).keys() >= {str(m.message_id) for m in more}


async def test_of_two_attempts_of_one_partition_at_once_one_writes_and_one_fails(
    tmp_path: Path, pg_dsn: str, pg_schema: str, kafka_bootstrap: str
) -> None:
    setup = Setup(tmp_path, pg_dsn, pg_schema, kafka_bootstrap)
    await setup.install()
    sent = [message(n) for n in range(400)]
    end = (await setup.produce([(m, 0, None) for m in sent]))[0]
    spec = JobSpec.from_file(str(setup.config), "from-kafka")
    table = f'"{pg_schema}"."{setup.queue}"'

    # The table locked, both attempts read the stored position and then wait to write their
    # first batch: as a speculative or zombie attempt would overlap the first one.
    with psycopg.connect(pg_dsn) as lock:
        lock.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
        attempts = [asyncio.ensure_future(move_partition(spec, 0, 0, end)) for _ in range(2)]
        deadline = time.monotonic() + 60
        while _waiting_on(pg_dsn, table) < 2:
            assert time.monotonic() < deadline, "the attempts never reached the table"
            assert not any(a.done() for a in attempts), [a.result() for a in attempts]
            await asyncio.sleep(0.05)
    outcomes = await asyncio.gather(*attempts, return_exceptions=True)

    moved = [o for o in outcomes if not isinstance(o, BaseException)]
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(moved) == 1 and moved[0].moved == 400
    assert len(failed) == 1 and isinstance(failed[0], RangeTakenOver), failed
    assert "another attempt moved this range" in str(failed[0])
    rows = pg_rows(pg_dsn, pg_schema, setup.queue)
    assert len(rows) == 400  # one row per record, not two
    assert by_id(rows).keys() == {str(m.message_id) for m in sent}
    assert setup.checkpoints() == {f"{setup.group}/{setup.topic}/0": end}


def _waiting_on(dsn: str, table: str) -> int:
    """Sessions waiting for a lock on `table`."""
    with psycopg.connect(dsn) as db:
        row = db.execute(
            "SELECT count(*) FROM pg_locks WHERE relation = %s::regclass AND NOT granted",
            (table,),
        ).fetchone()
    return int(row[0]) if row else 0


async def _produce_poison(setup: Setup, partition: int) -> int:
    """A record with a header that is not UTF-8; returns the partition's end offset."""
    producer = AIOKafkaProducer(bootstrap_servers=setup.kafka, enable_idempotence=False)
    await producer.start()
    try:
        sent = await producer.send_and_wait(
            setup.topic, b"poison", headers=[("bad", b"\xff\xfe")], partition=partition
        )
        return int(sent.offset) + 1
    finally:
        await producer.stop()


class RefusingSink:
    """Accepts everything but messages with a `refuse` header, which it rejects for good."""

    def __init__(self) -> None:
        self.got: list[Envelope] = []
        self.checkpoints: list[dict[str, int]] = []

    async def send(
        self, envelopes: Sequence[Envelope], checkpoint: Mapping[str, int] | None = None
    ) -> None:
        for index, envelope in enumerate(envelopes):
            if envelope.headers.get("refuse") is not None:
                raise MessageRejected("too large for the destination", index=index)
        self.got.extend(envelopes)
        self.checkpoints.append(dict(checkpoint or {}))

    async def close(self) -> None:
        pass


async def test_a_partition_source_dead_letters_what_the_destination_refuses(
    tmp_path: Path, pg_dsn: str, pg_schema: str, kafka_bootstrap: str
) -> None:
    setup = Setup(tmp_path, pg_dsn, pg_schema, kafka_bootstrap)
    await setup.install()
    sent = [message(n) for n in range(30)]
    sent[7].headers.add("refuse", "yes")
    end = await setup.produce([(m, 0, None) for m in sent])
    _, route = JobSpec.from_file(str(setup.config), "from-kafka").load()
    kafka = setup.transport("kafka")
    assert isinstance(kafka, KafkaTransport)
    source = kafka.source(
        setup.topic, group=setup.group, error_queue=setup.errors, offsets=(0, 0, end[0])
    )
    sink = RefusingSink()
    try:
        moved = await run_until_exhausted(route, source, sink)
    finally:
        await kafka.close()
    assert (moved.moved, moved.poison) == (29, 1)
    assert [m.message_id for m in sink.got] == [m.message_id for i, m in enumerate(sent) if i != 7]
    assert sink.checkpoints[-1] == {f"{setup.group}/{setup.topic}/0": end[0]}
    (copy,) = await setup.read(setup.errors)
    headers = dict((k, None if v is None else v.decode()) for k, v in copy.headers)
    assert headers["NServiceBus.MessageId"] == sent[7].message_id
    assert headers["NServiceBus.FailedQ"] == setup.topic
    assert "too large" in str(headers["NServiceBus.ExceptionInfo.Message"])


async def test_a_task_whose_commit_answer_is_lost_goes_on_from_the_position_it_stored(
    tmp_path: Path, pg_dsn: str, pg_schema: str, kafka_bootstrap: str
) -> None:
    """The connection drops after a batch's COMMIT and before its answer: the rows and the
    position are stored, and the task does not know it. When it sends the batch again, its
    fenced write finds its own position there, not another attempt's: it goes on from there,
    and writes each row once, instead of failing as if the range had been taken over."""
    with FaultProxy("127.0.0.1", 5432, POSTGRES) as proxy:
        dsn = f"postgresql://postgres@{proxy.address}/test?sslmode=disable"
        setup = Setup(tmp_path, dsn, pg_schema, kafka_bootstrap)
        await setup.install()
        sent = [message(n) for n in range(200)]
        end = (await setup.produce([(m, 0, None) for m in sent]))[0]
        spec = JobSpec.from_file(str(setup.config), "from-kafka")
        # The first COMMIT creates the checkpoint table; the second is the first batch's.
        cut = proxy.arm(postgres_commit(), skip=1)
        await move_partition(spec, 0, 0, end)
        assert cut.fired == 1
    rows = pg_rows(pg_dsn, pg_schema, setup.queue)
    assert len(rows) == 200
    assert by_id(rows).keys() == {str(m.message_id) for m in sent}
