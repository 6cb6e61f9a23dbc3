"""Delays asked for on Kafka (the record header `NServiceBus.Bridge.DeliverAt`) through a real
`bridge run`: to RabbitMQ the message waits in NServiceBus's delay infrastructure and arrives
when due, never early; to a destination that cannot delay (Kafka, without a `delays:`
connection) it goes to the route's error queue with the reason, and the records around it
flow on."""

from __future__ import annotations

import asyncio
import json
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

import pika
import pytest
from aiokafka import AIOKafkaProducer

from bridge.nservicebus.wireformat import timestamp_seconds
from tests.conftest import unique
from tests.support.cli import run_bridge
from tests.support.queues import topic_records

pytestmark = pytest.mark.integration

DELAY = 8.0


def bridge(config: Path, *args: str) -> None:
    run_bridge(*args, config=config)


def arrivals(url: str, queue: str, until: float) -> dict[str, float]:
    """When each message reached `queue`, polled until three did or `until`; the queue is
    deleted afterwards. None carries the Kafka request header."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    arrived: dict[str, float] = {}
    try:
        while len(arrived) < 3 and time.time() < until:
            method, properties, _ = channel.basic_get(queue, auto_ack=True)
            if method is None:
                time.sleep(0.05)
                continue
            assert "NServiceBus.Bridge.DeliverAt" not in (properties.headers or {})
            arrived[properties.message_id] = time.time()
        channel.queue_delete(queue)
    finally:
        connection.close()
    return arrived


async def test_a_delay_asked_for_on_kafka_is_carried_out_or_refused_by_the_destination(
    tmp_path: Path, kafka_bootstrap: str, rabbitmq_url: str
) -> None:
    topic, queue, errors = unique("delays"), unique("Delayed"), unique("errors")
    plain = unique("plain")
    config = tmp_path / "routes.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            connections:
              kafka: {{type: kafka, bootstrap_servers: "{kafka_bootstrap}", idempotence: false,
                       partitions: 1, session_timeout_ms: 3000}}
              kafka2: {{type: kafka, bootstrap_servers: "{kafka_bootstrap}", idempotence: false,
                        partitions: 1}}
              rabbit: {{type: rabbitmq, url: "{rabbitmq_url}", topology: direct}}
            routes:
              - name: to-rabbit
                from: {{connection: kafka, topic: "{topic}", group: "{unique("g")}"}}
                to: {{connection: rabbit, queue: "{queue}"}}
              - name: to-kafka
                from: {{connection: kafka, topic: "{topic}", group: "{unique("g")}"}}
                to: {{connection: kafka2, topic: "{plain}"}}
                error_queue: "{errors}"
            """
        )
    )
    await asyncio.to_thread(bridge, config, "install")
    due = time.time() + DELAY
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False)
    await producer.start()
    try:
        at = datetime.fromtimestamp(due, UTC).isoformat()
        for message_id, headers in (
            ("now-1", []),
            ("later", [("NServiceBus.Bridge.DeliverAt", at.encode())]),
            ("now-2", []),
        ):
            headers.append(("NServiceBus.MessageId", message_id.encode()))
            await producer.send(topic, b"{}", headers=headers)
        await producer.flush()
    finally:
        await producer.stop()
    await asyncio.to_thread(bridge, config, "run", "--until-idle", "1")

    arrived = await asyncio.to_thread(arrivals, rabbitmq_url, queue, due + 15)
    assert set(arrived) == {"now-1", "later", "now-2"}
    assert arrived["now-1"] < arrived["later"] and arrived["now-2"] < arrived["later"]
    lateness = arrived["later"] - due
    assert 0 <= lateness < 3, f"lateness {lateness:.2f} s"

    ids = [
        dict(r.headers)["NServiceBus.MessageId"]
        for r in await topic_records(kafka_bootstrap, plain)
    ]
    assert ids == [b"now-1", b"now-2"]
    # The error queue is on the source's side: a topic.
    (refused,) = await topic_records(kafka_bootstrap, errors)
    headers = {name: (value or b"").decode() for name, value in refused.headers}
    assert headers["NServiceBus.MessageId"] == "later"
    assert "this destination cannot delay" in headers["NServiceBus.ExceptionInfo.Message"]
    # It keeps its delay request: a retry to the topic is delayed as it first asked.
    assert abs(timestamp_seconds(headers["NServiceBus.Bridge.DeliverAt"]) - due) < 1e-3


async def test_peek_of_a_topic_shows_the_delays_waiting_for_it_in_bridge_delays(
    tmp_path: Path, kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A topic cannot hold a delayed message: `bridge peek` shows those waiting for it in the
    `delays:` connection's BridgeDelays, and when the first is due."""
    from bridge.commands import peek, send

    topic = unique("waiting")
    config = tmp_path / "routes.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            connections:
              kafka: {{type: kafka, bootstrap_servers: "{kafka_bootstrap}", idempotence: false,
                       partitions: 1}}
              lite: {{type: sqlite, path: "{tmp_path / "delays.db"}"}}
            delays: {{connection: lite}}
            routes:
              - {{name: r, from: {{connection: lite, queue: In}}, to: {{connection: kafka,
                  topic: "{topic}"}}}}
            """
        )
    )
    await asyncio.to_thread(bridge, config, "install")
    for delay in ("00:10:00", "00:05:00"):
        args = {"headers": [], "body": "{}", "ttl": None, "count": 1, "delay": delay}
        assert await send(str(config), "kafka", topic, **args) == 0
    capsys.readouterr()
    assert await peek(str(config), "kafka", topic, as_json=True) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["delayed"] == 2
    assert 280 < stats["next_due_seconds"] <= 300
