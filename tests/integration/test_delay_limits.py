"""Delays asked for on Kafka (`NServiceBus.Bridge.DeliverAt`) that no destination can carry
out, through a real `bridge run`: a time decades ahead, past what each destination that delays
can hold (a SQL delayed table, an NGinn `R` row, `BridgeDelays`: 2^31-1 s; RabbitMQ's delay
levels: 2^28-1 s), and a header that is not a time. Each goes to its route's error queue with
the reason in its headers; the messages around it go on, and a delay the destination can hold
waits there as usual."""

from __future__ import annotations

import asyncio
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pika
import pytest
from aiokafka import AIOKafkaProducer

from bridge.config.loader import load_config
from bridge.nservicebus.wireformat import timestamp_seconds
from bridge.transports import load
from tests.conftest import unique
from tests.support.cli import run_bridge
from tests.support.queues import drain, topic_headers

pytestmark = pytest.mark.integration

#: 20 years: beyond RabbitMQ's 2^28-1 s (8.5 years), within SQL's 2^31-1 s (68 years).
TWENTY_YEARS = 20 * 365 * 86400
SQL_ENDS = ("pg", "lite", "ng")


def bridge(config: Path, *args: str) -> None:
    run_bridge(*args, config=config)


def rabbit_ids(url: str, queue: str) -> list[str]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    ids = []
    try:
        while (got := channel.basic_get(queue, auto_ack=True))[0] is not None:
            ids.append(got[1].message_id)
    finally:
        connection.close()
    return ids


async def test_a_delay_no_destination_can_hold_and_one_that_is_not_a_time_go_to_the_error_queue(
    tmp_path: Path,
    kafka_bootstrap: str,
    rabbitmq_url: str,
    rabbitmq_queues: Any,
    pg_dsn: str,
    pg_schema: str,
) -> None:
    topic, queue, plain = unique("asks"), rabbitmq_queues("Delayed"), unique("plain")
    errors = {end: unique(f"errors-{end}") for end in (*SQL_ENDS, "rabbit", "kafka")}
    ends = {
        "pg": "to: {connection: pg, queue: Out}",
        "lite": "to: {connection: lite, queue: Out}",
        "ng": "to: {connection: ng, queue: Out}",
        "rabbit": f'to: {{connection: rabbit, queue: "{queue}"}}',
        "kafka": f'to: {{connection: kafka2, topic: "{plain}"}}',
    }
    routes = "".join(
        f"""
              - name: {end}
                from: {{connection: kafka, topic: "{topic}", group: "{unique("g")}"}}
                {to}
                error_queue: "{errors[end]}\""""
        for end, to in ends.items()
    )
    config = tmp_path / "routes.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            connections:
              kafka: {{type: kafka, bootstrap_servers: "{kafka_bootstrap}", idempotence: false,
                       partitions: 1, session_timeout_ms: 3000}}
              kafka2: {{type: kafka, bootstrap_servers: "{kafka_bootstrap}", idempotence: false,
                        partitions: 1}}
              pg: {{type: postgresql, dsn: "{pg_dsn}", schema: {pg_schema}}}
              lite: {{type: sqlite, path: "{tmp_path / "lite.db"}"}}
              ng: {{type: sqlite, path: "{tmp_path / "ng.db"}", layout: nginn,
                    nginn: {{alias: ng, timezone: Europe/Warsaw,
                           types: {{Sales.OrderPlaced: "Sales.OrderPlaced, Sales"}}}}}}
              rabbit: {{type: rabbitmq, url: "{rabbitmq_url}", topology: direct}}
            delays: {{connection: pg}}
            routes:"""
        )
        + routes
        + "\n"
    )
    await asyncio.to_thread(bridge, config, "install")
    now = time.time()
    asks = {
        "now-1": None,
        "far": "2200-01-01T00:00:00Z",
        "mid": datetime.fromtimestamp(now + TWENTY_YEARS, UTC).isoformat(),
        "bad": "soon",
        "now-2": None,
    }
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False)
    await producer.start()
    try:
        for message_id, deliver_at in asks.items():
            headers = [
                ("NServiceBus.MessageId", message_id.encode()),
                ("NServiceBus.EnclosedMessageTypes", b"Sales.OrderPlaced"),
            ]
            if deliver_at is not None:
                headers.append(("NServiceBus.Bridge.DeliverAt", deliver_at.encode()))
            await producer.send(topic, b"{}", headers=headers)
        await producer.flush()
    finally:
        await producer.stop()
    await asyncio.to_thread(bridge, config, "run", "--until-idle", "2")

    refused = {end: await topic_headers(kafka_bootstrap, errors[end]) for end in errors}
    for end, copies in refused.items():
        by_id = {copy["NServiceBus.MessageId"]: copy for copy in copies}
        expected = {"far", "bad", "mid"} if end == "rabbit" else {"far", "bad"}
        assert set(by_id) == expected, end
        assert "is not a time: 'soon'" in by_id["bad"]["NServiceBus.ExceptionInfo.Message"]
        longest = 2**28 - 1 if end == "rabbit" else 2**31 - 1
        for refused_id in expected - {"bad"}:
            reason = by_id[refused_id]["NServiceBus.ExceptionInfo.Message"]
            assert f"longer than the {longest} s" in reason, (end, reason)
            asked = asks[refused_id]
            assert asked is not None  # kept on the copy: a retry asks again
            kept = by_id[refused_id]["NServiceBus.Bridge.DeliverAt"]
            assert timestamp_seconds(kept) == datetime.fromisoformat(asked).timestamp()
        assert by_id["bad"]["NServiceBus.Bridge.DeliverAt"] == "soon"  # the record as it was

    loaded = load_config(config).config
    for end in SQL_ENDS:
        transport = load(end, loaded.connections[end])
        try:
            stats = await transport.peek("Out")
            arrived = [e.message_id for e in await drain(transport, "Out")]
        finally:
            await transport.close()
        assert arrived == ["now-1", "now-2"], end
        assert stats.delayed == 1, end  # "mid", waiting
    assert rabbit_ids(rabbitmq_url, queue) == ["now-1", "now-2"]
    assert [r["NServiceBus.MessageId"] for r in await topic_headers(kafka_bootstrap, plain)] == [
        "now-1",
        "now-2",
    ]
    store = load("pg", loaded.connections["pg"])
    try:
        from bridge.service.delaying import waiting_delays

        waiting = await waiting_delays(loaded, "kafka2", plain, lambda name: store)
    finally:
        await store.close()
    assert waiting is not None and waiting[0] == 1  # "mid", in BridgeDelays
