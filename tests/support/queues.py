"""Reading queues and topics in tests: a queue empty, as a consumer that commits what it takes;
a topic from its start, as a consumer outside any group."""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer

from bridge.envelope import Envelope
from bridge.protocols import Transport

__all__ = ["drain", "topic_headers", "topic_records"]


async def drain(transport: Transport, queue: str, batch_size: int = 500) -> list[Envelope]:
    """Every message in `queue` (a SQL table or RabbitMQ queue), taken and committed in order,
    until a receive comes back empty."""
    source = transport.source(queue)
    got: list[Envelope] = []
    try:
        while True:
            batch = await source.receive_batch(batch_size, 0.2)
            async with batch:
                got.extend(batch.messages)
                await batch.commit()
            if not batch.messages:
                return got
    finally:
        await source.close()


async def topic_records(bootstrap: str, topic: str, timeout_ms: int = 10_000) -> list[Any]:
    """The records of `topic` one fetch brings, from its start (aiokafka's ConsumerRecords)."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        fetched = await consumer.getmany(timeout_ms=timeout_ms)
    finally:
        await consumer.stop()
    return [record for batch in fetched.values() for record in batch]


async def topic_headers(bootstrap: str, topic: str) -> list[dict[str, str]]:
    """The headers of each record `topic_records` brings, decoded (the last of a repeated one)."""
    return [
        {name: (value or b"").decode() for name, value in record.headers}
        for record in await topic_records(bootstrap, topic)
    ]
