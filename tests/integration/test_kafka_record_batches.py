"""The `kafka_record_batches` seam against the real local broker: the sink's own record batches
(`send_in_batches`) and aiokafka's `send` per record (`send_each`) put the same records on the
same partitions in the same order, and both wait for every acknowledgement."""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from bridge.config.models import KafkaConnection
from bridge.transports.kafka import Transport
from bridge.transports.kafka.headers import Record
from bridge.transports.kafka.producer import SendRecords, send_each, send_in_batches
from tests.conftest import unique

pytestmark = pytest.mark.integration

PARTITIONS = 3
#: Small enough that one call's records for a partition fill several record batches.
MAX_BATCH_SIZE = 16 * 1024

#: What a record on the topic says, without its offset: key, value, headers, timestamp.
Landed = tuple[bytes | None, bytes, list[tuple[str, bytes | None]], int]


@asynccontextmanager
async def kafka(bootstrap: str) -> AsyncIterator[Transport]:
    config = KafkaConnection.model_validate(
        {
            "type": "kafka",
            "bootstrap_servers": bootstrap,
            "idempotence": False,
            "partitions": PARTITIONS,
            "max_batch_size": MAX_BATCH_SIZE,
        }
    )
    transport = Transport("kafka", config)
    try:
        yield transport
    finally:
        await transport.close()


def records(count: int, seed: int) -> list[Record]:
    rng = random.Random(seed)
    now_ms = int(time.time() * 1000)
    out = []
    for i in range(count):
        key = None if i % 50 == 49 else f"k-{rng.randrange(40)}".encode()
        value = rng.randbytes(rng.choice([0, 10, 300, 5000]))
        headers: list[tuple[str, bytes | None]] = [
            ("NServiceBus.MessageId", f"id-{i}".encode()),
            ("dup", b"first"),
            ("null", None),
            ("dup", f"东京 {i}".encode()),
        ]
        out.append(Record(key, value, headers, now_ms + i))
    return out


async def read_back(bootstrap: str, topic: str, count: int) -> dict[int, list[Landed]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        landed: dict[int, list[Landed]] = {p: [] for p in range(PARTITIONS)}
        deadline = time.monotonic() + 30
        while sum(map(len, landed.values())) < count:
            assert time.monotonic() < deadline, f"read {sum(map(len, landed.values()))}/{count}"
            for tp, batch in (await consumer.getmany(timeout_ms=500)).items():
                landed[tp.partition] += [
                    (r.key, r.value, list(r.headers), r.timestamp) for r in batch
                ]
        return landed
    finally:
        await consumer.stop()


async def test_batches_and_plain_sends_land_the_same_records_in_the_same_order(
    kafka_bootstrap: str,
) -> None:
    sent = records(600, seed=600)
    landed: dict[str, dict[int, list[Landed]]] = {}
    implementations: dict[str, SendRecords] = {"fast": send_in_batches, "plain": send_each}
    async with kafka(kafka_bootstrap) as transport:
        for name, send in implementations.items():
            topic = unique(f"batches-{name}")
            await transport.install([topic])
            producer = await transport.producer()
            for start in range(0, len(sent), 200):
                assert await send(producer, topic, sent[start : start + 200]) is None
            landed[name] = await read_back(kafka_bootstrap, topic, len(sent))

    keyed = {
        name: {p: [r for r in rs if r[0] is not None] for p, rs in by.items()}
        for name, by in landed.items()
    }
    assert keyed["fast"] == keyed["plain"]
    for name, by_partition in landed.items():
        every = sorted((r for rs in by_partition.values() for r in rs), key=lambda r: r[3])
        assert every == [(r.key, r.value, r.headers, r.timestamp_ms) for r in sent], name
        for records_of_partition in by_partition.values():  # in the order they were given
            stamps = [r[3] for r in records_of_partition]
            assert stamps == sorted(stamps), name
    assert all(keyed["fast"].values())  # every partition got keyed records
