"""A Kafka-sourced message the destination refuses for good goes to the error topic."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from bridge.config.models import KafkaConnection, Route
from bridge.protocols import Sink, Source
from bridge.routing.runner import RouteRunner
from bridge.transports.kafka import Transport as Kafka
from bridge.transports.memory import Broker
from bridge.transports.memory import Transport as Memory
from tests.conftest import unique
from tests.unit.test_runner import RejectingSink

pytestmark = pytest.mark.integration


async def test_refused_record_goes_to_the_error_topic(kafka_bootstrap: str) -> None:
    topic, errors, group = unique("t"), unique("err"), unique("g")
    kafka = Kafka(
        "kafka",
        KafkaConnection(
            type="kafka",
            bootstrap_servers=kafka_bootstrap,
            idempotence=False,
            partitions=1,
            session_timeout_ms=3000,
        ),
    )
    await kafka.install([topic, errors])
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False)
    await producer.start()
    for i in range(10):
        await producer.send(
            topic, str(i).encode(), headers=[("NServiceBus.MessageId", f"m{i}".encode())]
        )
    await producer.flush()
    await producer.stop()

    memory = Memory(broker=Broker())
    route = Route.model_validate(
        {
            "name": "r",
            "from": {"connection": "kafka", "topic": topic, "group": group},
            "to": {"connection": "mem", "queue": "dst"},
            "error_queue": errors,
        }
    )

    def endpoints() -> tuple[Source, Sink]:
        source = kafka.source(topic, group=group, error_queue=errors)
        return source, RejectingSink(memory.sink("dst"), {b"3"}, say_which=True)

    runner = RouteRunner(route, endpoints, poll_timeout=0.2)
    task = asyncio.create_task(runner.run())
    deadline = time.monotonic() + 30
    while len(memory.broker.queue("dst")) < 9:
        assert time.monotonic() < deadline and not task.done()
        await asyncio.sleep(0.05)
    runner.stop()
    await task
    await kafka.close()

    consumer = AIOKafkaConsumer(
        errors,
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        group_id=unique("r"),
    )
    await consumer.start()
    try:
        fetched = await consumer.getmany(timeout_ms=10_000)
        records = [r for batch in fetched.values() for r in batch]
    finally:
        await consumer.stop()
    assert [r.value for r in records] == [b"3"]
    headers = {k: v.decode() for k, v in records[0].headers if v is not None}
    assert headers["NServiceBus.MessageId"] == "m3"
    assert headers["NServiceBus.FailedQ"] == topic
    assert headers["NServiceBus.ExceptionInfo.ExceptionType"] == "bridge.errors.MessageRejected"
    assert sorted(e.body for e in memory.broker.queue("dst")) == [  # type: ignore[union-attr]
        str(i).encode() for i in range(10) if i != 3
    ]
