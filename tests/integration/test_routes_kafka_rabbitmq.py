"""Kafka -> RabbitMQ -> Kafka through one `bridge run`: the same envelope in both brokers."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pika
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from bridge.config.loader import load_config
from bridge.transports import load
from tests.conftest import unique

pytestmark = pytest.mark.integration

HEADERS = [
    ("NServiceBus.MessageId", "will be replaced"),
    ("NServiceBus.ContentType", "application/json"),
    ("NServiceBus.EnclosedMessageTypes", "Shop.OrderPlaced, Shop"),
    ("NServiceBus.ReplyToAddress", "Sales"),
    ("NServiceBus.CorrelationId", "corr-1"),
    ("unicode", "café / 東京"),
    ("empty", ""),
]


@pytest.fixture
async def config(
    tmp_path: Path, kafka_bootstrap: str, rabbitmq_url: str
) -> AsyncIterator[dict[str, str]]:
    names = {
        "inbound": unique("in"),
        "outbound": unique("out"),
        "queue": unique("q"),
        "group": unique("g"),
    }
    path = tmp_path / "routes.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            connections:
              kafka: {{type: kafka, bootstrap_servers: "{kafka_bootstrap}", idempotence: false,
                       partitions: 1, session_timeout_ms: 3000}}
              rabbit: {{type: rabbitmq, url: "{rabbitmq_url}", topology: direct}}
            routes:
              - name: kafka-to-rabbit
                from: {{connection: kafka, topic: "{names["inbound"]}", group: "{names["group"]}"}}
                to: {{connection: rabbit, queue: "{names["queue"]}"}}
                error_queue: "{names["inbound"]}.errors"
                address_map: {{"Sales": "Sales.Rabbit"}}
              - name: rabbit-to-kafka
                from: {{connection: rabbit, queue: "{names["queue"]}"}}
                to: {{connection: kafka, topic: "{names["outbound"]}"}}
                error_queue: "{names["queue"]}.errors"
            """
        )
    )
    names["path"] = str(path)
    yield names
    loaded = load_config(path).config
    rabbit = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    channel = rabbit.channel()
    for queue in (names["queue"], names["queue"] + ".errors"):
        channel.queue_delete(queue)
    rabbit.close()
    await load("kafka", loaded.connections["kafka"]).close()


def bridge(config: dict[str, str], *args: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bridge", *args, "-c", config["path"]],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr


async def test_kafka_to_rabbitmq_to_kafka(config: dict[str, str], kafka_bootstrap: str) -> None:
    await asyncio.to_thread(bridge, config, "install")
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False)
    await producer.start()
    try:
        for i in range(200):
            headers = [
                (k, (f"m{i}" if k == "NServiceBus.MessageId" else v).encode()) for k, v in HEADERS
            ]
            await producer.send(config["inbound"], bytes([i]) * i, headers=headers)
        await producer.flush()
    finally:
        await producer.stop()
    await asyncio.to_thread(bridge, config, "run", "--until-idle", "2")

    consumer = AIOKafkaConsumer(
        config["outbound"],
        bootstrap_servers=kafka_bootstrap,
        group_id=unique("r"),
        auto_offset_reset="earliest",
    )
    await consumer.start()
    records = []
    try:
        while len(records) < 200:
            fetched = await consumer.getmany(timeout_ms=5000)
            assert fetched, f"only {len(records)} records arrived"
            records.extend(r for batch in fetched.values() for r in batch)
    finally:
        await consumer.stop()
    assert [r.value for r in records] == [bytes([i]) * i for i in range(200)]
    for i, record in enumerate(records):
        headers = [(k, v.decode() if v is not None else None) for k, v in record.headers]
        expected = [(k, f"m{i}" if k == "NServiceBus.MessageId" else v) for k, v in HEADERS]
        expected = [
            (k, "Sales.Rabbit" if k == "NServiceBus.ReplyToAddress" else v) for k, v in expected
        ]
        assert headers == expected
        assert record.key == f"m{i}".encode()
