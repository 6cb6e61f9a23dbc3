"""NGinn.MessageBus tables in real `bridge run` processes: NGinn -> Kafka and RabbitMQ with the
mapped headers, an NServiceBus endpoint's message -> an NGinn table, and kill -9 mid-stream.

NGinn's side is its own statements, replayed (`tests.support.nginn`); Kafka and RabbitMQ are
read with plain clients; the NServiceBus side is written by `bridge send`, as an endpoint
writes its queue table.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pika
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from bridge.nservicebus.wireformat import parse_timestamp
from tests.conftest import unique
from tests.faults import BridgeProcess, kill_mid_stream, report
from tests.support.nginn import NGinn

pytestmark = pytest.mark.integration

ZONE = "Asia/Tokyo"
ORDER_TYPE = "Sales.Messages.OrderPlaced, Sales.Messages"
BATCH = 100


class Rig:
    def __init__(self, tmp_path: Path, pg_dsn: str, schema: str, kafka: str, rabbit: str) -> None:
        self.kafka, self.rabbit = kafka, rabbit
        self.orders, self.inbox, self.sales = unique("Orders"), unique("Inbox"), unique("Sales")
        self.topic, self.queue = unique("topic"), unique("q")
        lite = tmp_path / "nginn.db"
        nginn = f'{{timezone: {ZONE}, alias: db, types: {{Sales.OrderPlaced: "{ORDER_TYPE}"}}}}'
        self.config = tmp_path / "routes.yaml"
        self.config.write_text(
            textwrap.dedent(
                f"""\
                connections:
                  ngpg: {{type: postgresql, dsn: "{pg_dsn}", schema: "{schema}",
                          layout: nginn, nginn: {nginn}}}
                  nglite: {{type: sqlite, path: "{lite}", layout: nginn, nginn: {nginn}}}
                  nsb: {{type: postgresql, dsn: "{pg_dsn}", schema: "{schema}"}}
                  kafka: {{type: kafka, bootstrap_servers: "{kafka}", idempotence: false,
                           partitions: 1, session_timeout_ms: 3000}}
                  rabbit: {{type: rabbitmq, url: "{rabbit}", queue_type: quorum}}
                routes:
                  - name: nginn-to-kafka
                    from: {{connection: ngpg, queue: "{self.orders}"}}
                    to: {{connection: kafka, topic: "{self.topic}"}}
                    batch_size: {BATCH}
                  - name: nginn-to-rabbit
                    from: {{connection: nglite, queue: "{self.orders}"}}
                    to: {{connection: rabbit, queue: "{self.queue}"}}
                  - name: nservicebus-to-nginn
                    from: {{connection: nsb, queue: "{self.sales}"}}
                    to: {{connection: ngpg, queue: "{self.inbox}"}}
                """
            )
        )
        self.pg = NGinn("postgresql", f"{pg_dsn}|{schema}", self.orders, ZONE)
        self.lite = NGinn("sqlite", str(lite), self.orders, ZONE)
        self.run("install")

    def bridge(self, *args: str) -> BridgeProcess:
        return BridgeProcess(self.config, *args)

    def run(self, *args: str) -> str:
        with self.bridge(*args).start() as bridge:
            code = bridge.wait(timeout=120)
        assert code == 0 and "Traceback" not in bridge.output(), bridge.output()
        return bridge.output()

    async def kafka_records(self) -> list[tuple[dict[str, str], bytes]]:
        consumer = AIOKafkaConsumer(
            self.topic,
            bootstrap_servers=self.kafka,
            group_id=unique("count"),
            auto_offset_reset="earliest",
            session_timeout_ms=3000,
            heartbeat_interval_ms=1000,
        )
        await consumer.start()
        got: list[tuple[dict[str, str], bytes]] = []
        try:
            quiet = 0
            while quiet < 3:
                fetched = await consumer.getmany(timeout_ms=1000)
                quiet = 0 if fetched else quiet + 1
                for batch in fetched.values():
                    for record in batch:
                        headers = {k: v.decode() for k, v in record.headers}
                        got.append((headers, record.value or b""))
        finally:
            await consumer.stop()
        return got

    async def kafka_count(self) -> int:
        consumer = AIOKafkaConsumer(bootstrap_servers=self.kafka)
        await consumer.start()
        try:
            return sum((await consumer.end_offsets([TopicPartition(self.topic, 0)])).values())
        finally:
            await consumer.stop()

    def rabbit_messages(self) -> list[tuple[pika.BasicProperties, bytes]]:
        connection = pika.BlockingConnection(pika.URLParameters(self.rabbit))
        channel = connection.channel()
        got = []
        while True:
            method, properties, body = channel.basic_get(self.queue, auto_ack=True)
            if method is None:
                break
            got.append((properties, body))
        connection.close()
        return got

    def close(self) -> None:
        connection = pika.BlockingConnection(pika.URLParameters(self.rabbit))
        channel = connection.channel()
        channel.queue_delete(self.queue)
        channel.exchange_delete(self.queue)
        connection.close()


@pytest.fixture
async def rig(
    tmp_path: Path, pg_dsn: str, pg_schema: str, kafka_bootstrap: str, rabbitmq_url: str
) -> AsyncIterator[Rig]:
    r = Rig(tmp_path, pg_dsn, pg_schema, kafka_bootstrap, rabbitmq_url)
    yield r
    r.close()


def order(n: int) -> str:
    return f'{{"$type":"{ORDER_TYPE}","OrderId":{n}}}'


async def test_rows_nginn_writes_reach_kafka_and_rabbitmq_with_the_mapped_headers(
    rig: Rig,
) -> None:
    before = datetime.now(UTC)
    for nginn in (rig.pg, rig.lite):
        nginn.send(order(1), "Tenant=acme", unique_id="u-1", correlation_id="c-1")
        nginn.send(order(2), "_NG-ReplyTo=sql://db/Replies")
    rig.run("run", "--route", "nginn-to-kafka", "--route", "nginn-to-rabbit", "--until-idle", "1")
    records = await rig.kafka_records()
    rabbit = rig.rabbit_messages()
    for headers in [records[0][0], rabbit[0][0].headers or {}]:
        assert headers["NServiceBus.MessageId"] == "u-1"
        assert headers["NServiceBus.CorrelationId"] == "c-1"
        assert headers["NServiceBus.EnclosedMessageTypes"] == "Sales.OrderPlaced"
        assert headers["NServiceBus.ReplyToAddress"] == "sql://db/Sender"
        assert headers["NServiceBus.OriginatingEndpoint"] == "sql://db/Sender"
        assert headers["NServiceBus.ContentType"] == "application/json"
        assert headers["NServiceBus.MessageIntent"] == "Send"
        assert headers["Tenant"] == "acme" and headers["NGinn.To"] == f"sql://db/{rig.orders}"
        sent = parse_timestamp(str(headers["NServiceBus.TimeSent"]))
        assert abs((sent - before).total_seconds()) < 30, "Tokyo insert_time read as UTC"
    assert rabbit[0][0].message_id == "u-1" and json.loads(rabbit[0][1])["OrderId"] == 1
    second = records[1][0]
    assert second["NServiceBus.ReplyToAddress"] == "sql://db/Replies"
    # no unique_id: made from the endpoint and id, the same on both (alias `db`, table, id 2)
    assert second["NServiceBus.MessageId"] == rabbit[1][0].message_id
    assert len(second["NServiceBus.MessageId"]) == 36
    assert [json.loads(body)["OrderId"] for _, body in records] == [1, 2]
    assert [r["subqueue"] for r in rig.pg.rows()] == ["X", "X"]
    assert [r["subqueue"] for r in rig.lite.rows()] == ["X", "X"]


async def test_a_message_an_nservicebus_endpoint_sent_reaches_nginn_typed(rig: Rig) -> None:
    rig.run(
        "send",
        "nsb",
        rig.sales,
        "--header",
        "NServiceBus.EnclosedMessageTypes=Sales.OrderPlaced, Sales, Version=1.0.0.0",
        "--body",
        '{"OrderId": 77}',
    )
    rig.run("run", "--route", "nservicebus-to-nginn", "--until-idle", "1")
    got = rig.pg.receive(rig.inbox)
    assert got is not None and got.to_endpoint == f"sql://db/{rig.inbox}"
    body = json.loads(got.body)
    assert next(iter(body)) == "$type" and body == {"$type": ORDER_TYPE, "OrderId": 77}
    assert got.unique_id == got.headers["NServiceBus.MessageId"]
    assert got.headers["NGinn.HeadersLeftOut"] == "1"  # EnclosedMessageTypes: `Version=`


@pytest.mark.slow
async def test_nginn_to_kafka_kill_9_loses_nothing(rig: Rig) -> None:
    total, kills = 12_000, 3
    with rig.pg.connection() as db:  # one batch insert, as NGinn's own (CommonQueueOps.cs:97)
        for n in range(total):
            rig.pg.insert(db, order(n), unique_id=f"n{n}")
    sent = {f"n{n}" for n in range(total)}
    with rig.bridge("run", "--route", "nginn-to-kafka") as bridge:
        at_kills = await kill_mid_stream(bridge, rig.kafka_count, total, kills)
    started = time.monotonic()
    await asyncio.to_thread(rig.run, "run", "--route", "nginn-to-kafka", "--until-idle", "1")
    assert time.monotonic() - started < 60
    ids = [headers["NServiceBus.MessageId"] for headers, _ in await rig.kafka_records()]
    report(f"nginn(pg)->kafka, kill -9 at {'/'.join(map(str, at_kills))}", sent, ids, kills * BATCH)
    assert {r["subqueue"] for r in rig.pg.rows()} == {"X"}
