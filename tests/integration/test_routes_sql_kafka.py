"""SQL <-> Kafka through real `bridge run` processes, counted end to end.

Kafka is read and written here with plain aiokafka clients (the raw side), SQL with the
transports' own code, so each test checks the bridge against something it did not write.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from bridge.config.loader import load_config
from bridge.envelope import Envelope, Headers
from bridge.protocols import Transport
from bridge.transports import load
from tests.conftest import unique

pytestmark = pytest.mark.integration

DIALECTS = ["sqlite", "postgresql"]


def connection_yaml(dialect: str, tmp_path: Path, pg_dsn: str, schema: str) -> str:
    if dialect == "sqlite":
        return f'{{type: sqlite, path: "{tmp_path / "queues.db"}"}}'
    return f'{{type: postgresql, dsn: "{pg_dsn}", schema: "{schema}"}}'


class Setup:
    def __init__(self, tmp_path: Path, dialect: str, kafka: str, pg_dsn: str, schema: str) -> None:
        self.tmp_path = tmp_path
        self.kafka = kafka
        self.topic = unique("topic")
        self.group = unique("group")
        self.queue = unique("Sales")
        self.back = unique("Back")
        self.config = tmp_path / "routes.yaml"
        self.config.write_text(
            textwrap.dedent(
                f"""\
                connections:
                  db: {connection_yaml(dialect, tmp_path, pg_dsn, schema)}
                  kafka: {{type: kafka, bootstrap_servers: "{kafka}", idempotence: false,
                           partitions: 3, session_timeout_ms: 3000}}
                routes:
                  - name: to-kafka
                    from: {{connection: db, queue: "{self.queue}"}}
                    to: {{connection: kafka, topic: "{self.topic}"}}
                    batch_size: 50
                  - name: by-conversation
                    from: {{connection: db, queue: "{self.queue}"}}
                    to: {{connection: kafka, topic: "{self.topic}"}}
                    key: header:NServiceBus.ConversationId
                    batch_size: 50
                  - name: from-kafka
                    from: {{connection: kafka, topic: "{self.topic}", group: "{self.group}"}}
                    to: {{connection: db, queue: "{self.back}"}}
                    batch_size: 50
                """
            )
        )
        config = load_config(self.config).config
        self.db: Transport = load("db", config.connections["db"])

    def bridge(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bridge",
                *args,
                "-c",
                str(self.config),
                "--log-level",
                "WARNING",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run(self, *args: str, timeout: float = 120) -> str:
        process = self.bridge(*args)
        out, err = process.communicate(timeout=timeout)
        assert process.returncode == 0, err
        assert "Traceback" not in err
        return out

    async def send_sql(self, count: int, start: int = 0) -> list[Envelope]:
        sent = [
            Envelope(
                Headers(
                    [
                        ("NServiceBus.MessageId", f"m-{i}"),
                        ("NServiceBus.ConversationId", f"c-{i % 5}"),
                        ("seq", str(i)),
                        ("null", None),
                        ("slash", "a/b"),
                    ]
                ),
                bytes([i % 256]) * (i % 300),
            )
            for i in range(start, start + count)
        ]
        sink = self.db.sink(self.queue)
        await sink.send(sent)
        await sink.close()
        return sent

    async def drain_sql(self, queue: str) -> list[Envelope]:
        source = self.db.source(queue)
        got: list[Envelope] = []
        try:
            while True:
                batch = await source.receive_batch(500, 0.2)
                async with batch:
                    got.extend(batch.messages)
                    await batch.commit()
                if not batch.messages:
                    return got
        finally:
            await source.close()

    async def read_topic(
        self, expected: int, timeout: float = 30
    ) -> list[tuple[bytes | None, Envelope]]:
        consumer = AIOKafkaConsumer(
            self.topic,
            bootstrap_servers=self.kafka,
            group_id=unique("reader"),
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        out: list[tuple[bytes | None, Envelope]] = []
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                records = await consumer.getmany(timeout_ms=500)
                for batch in records.values():
                    for r in batch:
                        headers = Headers(
                            (k, None if v is None else v.decode()) for k, v in r.headers
                        )
                        out.append((r.key, Envelope(headers, r.value or b"")))
                if len(out) >= expected and not records:
                    break
        finally:
            await consumer.stop()
        return out

    async def close(self) -> None:
        await self.db.close()


@pytest.fixture(params=DIALECTS)
async def setup(
    request: pytest.FixtureRequest, tmp_path: Path, kafka_bootstrap: str
) -> AsyncIterator[Setup]:
    dialect = request.param
    pg_dsn = request.getfixturevalue("pg_dsn") if dialect == "postgresql" else ""
    schema = request.getfixturevalue("pg_schema") if dialect == "postgresql" else ""
    s = Setup(tmp_path, dialect, kafka_bootstrap, pg_dsn, schema)
    s.run("install")
    yield s
    await s.close()


async def test_sql_to_kafka_to_sql_preserves_every_header_and_byte(setup: Setup) -> None:
    sent = await setup.send_sql(300)
    await asyncio.to_thread(setup.run, "run", "--until-idle", "2")
    back = await setup.drain_sql(setup.back)
    assert sorted(e.message_id or "" for e in back) == sorted(e.message_id or "" for e in sent)
    by_id = {e.message_id: e for e in back}
    for original in sent:
        copy = by_id[original.message_id]
        assert copy.body == original.body
        assert copy.headers.items() == original.headers.items()
    assert not await setup.drain_sql(setup.queue)


async def test_records_are_keyed_by_message_id_by_default(setup: Setup) -> None:
    await setup.send_sql(200)
    await asyncio.to_thread(setup.run, "run", "--route", "to-kafka", "--until-idle", "1")
    records = await setup.read_topic(200)
    assert len(records) == 200
    for key, envelope in records:
        assert key == (envelope.message_id or "").encode()


async def test_order_is_kept_within_a_key(setup: Setup) -> None:
    await setup.send_sql(500)
    await asyncio.to_thread(setup.run, "run", "--route", "by-conversation", "--until-idle", "1")
    records = await setup.read_topic(500)
    by_key: dict[bytes | None, list[int]] = {}
    for key, envelope in records:
        assert key == (envelope.headers.get("NServiceBus.ConversationId") or "").encode()
        by_key.setdefault(key, []).append(int(envelope.headers.get("seq") or 0))
    assert len(by_key) == 5
    for seqs in by_key.values():
        assert seqs == sorted(seqs) and len(seqs) == 100


async def test_two_bridges_on_one_queue_table_never_forward_the_same_row(setup: Setup) -> None:
    await setup.send_sql(1000)
    runs = [setup.bridge("run", "--route", "to-kafka", "--until-idle", "2") for _ in range(2)]
    for process in runs:
        _, err = await asyncio.to_thread(process.communicate, timeout=120)
        assert process.returncode == 0, err
    records = await setup.read_topic(1000)
    counts = Counter(e.message_id for _, e in records)
    assert len(counts) == 1000
    assert max(counts.values()) == 1


async def test_kafka_to_sql_resumes_after_restart_without_loss(setup: Setup) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=setup.kafka, acks="all", enable_idempotence=False)
    await producer.start()
    try:
        for i in range(100):
            await producer.send(
                setup.topic,
                f"first-{i}".encode(),
                headers=[("NServiceBus.MessageId", f"a{i}".encode())],
            )
        await producer.flush()
        await asyncio.to_thread(setup.run, "run", "--route", "from-kafka", "--until-idle", "1")
        for i in range(100):
            await producer.send(
                setup.topic,
                f"second-{i}".encode(),
                headers=[("NServiceBus.MessageId", f"b{i}".encode())],
            )
        await producer.flush()
    finally:
        await producer.stop()
    await asyncio.to_thread(setup.run, "run", "--route", "from-kafka", "--until-idle", "1")
    rows = await setup.drain_sql(setup.back)
    ids = Counter(e.message_id for e in rows)
    assert len(ids) == 200 and max(ids.values()) == 1


async def test_kafka_to_sql_survives_kill_9_exactly_once(setup: Setup) -> None:
    total = 20_000
    producer = AIOKafkaProducer(bootstrap_servers=setup.kafka, acks="all", enable_idempotence=False)
    await producer.start()
    try:
        for i in range(total):
            await producer.send(setup.topic, f"{i}".encode(), key=f"k{i % 17}".encode())
        await producer.flush()
    finally:
        await producer.stop()
    rng = random.Random(os.getpid())
    kills, delivered_at_kill = 0, []
    for _ in range(3):
        before = (await setup.db.peek(setup.back)).depth
        if before >= total:
            break
        process = setup.bridge("run", "--route", "from-kafka")
        deadline = time.monotonic() + 60
        while (await setup.db.peek(setup.back)).depth == before:  # consuming has begun
            assert time.monotonic() < deadline and process.poll() is None
            await asyncio.sleep(0.05)
        await asyncio.sleep(rng.uniform(0.0, 0.4))
        process.send_signal(signal.SIGKILL)
        await asyncio.to_thread(process.communicate)
        kills += 1
        delivered_at_kill.append((await setup.db.peek(setup.back)).depth)
    await asyncio.to_thread(setup.run, "run", "--route", "from-kafka", "--until-idle", "2")
    rows = await setup.drain_sql(setup.back)
    bodies = Counter(e.body for e in rows)
    lost = total - len(bodies)
    duplicated = sum(bodies.values()) - len(bodies)
    print(
        f"kafka->sql kill -9 x{kills} at rows {delivered_at_kill}: sent={total} "
        f"delivered={len(rows)} lost={lost} duplicated={duplicated}"
    )
    assert kills >= 1 and delivered_at_kill[0] < total  # killed mid-stream at least once
    assert lost == 0
    assert duplicated == 0
    ids = {e.message_id for e in rows}
    assert len(ids) == total  # deterministic ids: one per record, stable across redelivery
