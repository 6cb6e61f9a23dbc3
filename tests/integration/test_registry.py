"""The endpoint registry end to end, through real `bridge install/check/run/endpoints` processes
on real PostgreSQL, RabbitMQ, SQLite and the local Kafka broker.

The endpoints are played by this test as NServiceBus would play them: an endpoint on
PostgreSQL writes rows into the queue table it sends to (its canonical address in
`NServiceBus.ReplyToAddress`, `"schema"."table"`: PostgreSql/Addressing/CanonicalQueueAddress.cs:
14-15 of NServiceBus.SqlServer@214c4e8); one on RabbitMQ publishes to the exchange named like the
destination queue with every header a string (wire-format §7), and writes its error copies
(`NServiceBus.FailedQ` = its own queue) to the error queue as RecoverabilityComponent does;
ServiceControl retries by sending the copy to its FailedQ with `ServiceControl.Retry.*` headers.
What is checked is what the Messaging Bridge would do (MessageShovel.cs:24-75,
Particular/NServiceBus.MessagingBridge@ef463cf).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import textwrap
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pika
import psycopg
import pytest

from bridge.config.loader import load_config
from bridge.envelope import Envelope, Headers
from bridge.protocols import Transport
from bridge.transports import load
from tests.conftest import unique
from tests.support.cli import run_bridge
from tests.support.queues import drain

pytestmark = pytest.mark.integration

TRANSFER = "NServiceBus.Bridge.Transfer"


def bridge(config: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run_bridge(*args, config=config, check=check)


class Site:
    """Sales on PostgreSQL, Billing on RabbitMQ, ServiceControl's queues on PostgreSQL."""

    def __init__(
        self, tmp_path: Path, pg_dsn: str, schema: str, url: str, names: Callable[..., str]
    ) -> None:
        self.dsn, self.schema, self.url = pg_dsn, schema, url
        self.sales, self.billing = names("Sales"), names("Billing")
        self.error, self.control = names("error"), names("Particular.ServiceControl")
        self.poison = names("bridge.poison")  # the derived routes' error queue on each side
        self.config = tmp_path / "routes.yaml"
        self.config.write_text(
            textwrap.dedent(
                f"""\
                connections:
                  pg: {{type: postgresql, dsn: "{pg_dsn}", schema: "{schema}"}}
                  rabbit: {{type: rabbitmq, url: "{url}", queue_type: quorum}}
                endpoints:
                  {self.sales}: {{connection: pg}}
                  {self.billing}: {{connection: rabbit}}
                  {self.error}: {{connection: pg}}
                  {self.control}: {{connection: pg}}
                proxies: {{create: true, error_queue: {self.poison}, batch_size: 50}}
                """
            )
        )
        connections = load_config(self.config).config.connections
        self.pg: Transport = load("pg", connections["pg"])
        self.rabbit: Transport = load("rabbit", connections["rabbit"])
        self._connections: list[Any] = []

    def address(self, table: str) -> str:
        """A table's address as the NServiceBus PostgreSQL transport writes it."""
        return f'"{self.schema}"."{table}"'

    def channel(self) -> Any:
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        self._connections.append(connection)
        return connection.channel()

    def publish(self, queue: str, headers: dict[str, str], body: bytes = b"{}") -> None:
        """As an NServiceBus RabbitMQ endpoint sends: to the queue's exchange, confirmed."""
        channel = self.channel()
        channel.confirm_delivery()
        properties = pika.BasicProperties(
            message_id=headers["NServiceBus.MessageId"],
            reply_to=headers.get("NServiceBus.ReplyToAddress"),
            correlation_id=headers.get("NServiceBus.CorrelationId"),
            content_type="application/json",
            delivery_mode=2,
            headers=headers,
        )
        channel.basic_publish(queue, "", body, properties, mandatory=True)

    def take(self, queue: str) -> tuple[Any, dict[str, Any]]:
        """One message from a RabbitMQ queue: (properties, headers as text)."""
        method, properties, _ = self.channel().basic_get(queue, auto_ack=True)
        assert method is not None, f"nothing in {queue}"
        return properties, {
            k: v.decode() if isinstance(v, bytes) else v for k, v in properties.headers.items()
        }

    async def send_pg(self, table: str, *headers: tuple[str, str]) -> str:
        message_id = str(uuid.uuid4())
        sink = self.pg.sink(table)
        await sink.send(
            [Envelope(Headers([("NServiceBus.MessageId", message_id), *headers]), b"{}")]
        )
        await sink.close()
        return message_id

    async def drain_pg(self, table: str) -> list[Envelope]:
        return await drain(self.pg, table)

    def run(self) -> None:
        bridge(self.config, "run", "--until-idle", "2")

    async def close(self) -> None:
        await self.pg.close()
        await self.rabbit.close()
        for connection in self._connections:
            if connection.is_open:
                connection.close()


@pytest.fixture
async def site(
    tmp_path: Path,
    pg_dsn: str,
    pg_schema: str,
    rabbitmq_url: str,
    rabbitmq_queues: Callable[..., str],
) -> AsyncIterator[Site]:
    s = Site(tmp_path, pg_dsn, pg_schema, rabbitmq_url, rabbitmq_queues)
    # The endpoints' own queues are theirs: created as their installers would.
    await s.pg.install([s.sales, s.error, s.control])
    await s.rabbit.install([s.billing])
    yield s
    await s.close()


async def test_install_creates_the_proxies_and_check_finds_them(site: Site) -> None:
    before = bridge(site.config, "check", "--connect", check=False)
    assert before.returncode == 1
    assert f"{site.billing}" in before.stdout and "does not exist" in before.stdout
    assert "proxies: {create: true}" not in before.stdout  # they are created by install here
    installed = bridge(site.config, "install").stdout
    assert f"pg: installed {site.billing}, {site.poison}" in installed
    assert f"rabbit: installed {site.sales}, {site.poison}, {site.error}, {site.control}" in (
        installed
    )
    assert bridge(site.config, "check", "--connect").returncode == 0
    shown = json.loads(bridge(site.config, "endpoints", "--json").stdout)
    sales = next(e for e in shown["endpoints"] if e["name"] == site.sales)
    assert sales["addresses"]["pg"]["address"] == site.address(site.sales)
    assert sales["addresses"]["rabbit"] == {
        "queue": site.sales,
        "address": site.sales,
        "proxy": True,
        "route": f"proxy.rabbit.{site.sales}",
    }


async def test_request_and_reply_between_postgresql_and_rabbitmq_through_the_proxies(
    site: Site,
) -> None:
    bridge(site.config, "install")
    # Sales (PostgreSQL) sends to Billing: into the Billing proxy table on its own database.
    request = await site.send_pg(
        site.billing,
        ("NServiceBus.ReplyToAddress", site.address(site.sales)),
        ("NServiceBus.MessageIntent", "Send"),
        ("NServiceBus.CorrelationId", "c-1"),
    )
    # A native integration row with no message id at all (fidelity gap 2) crosses too.
    with psycopg.connect(site.dsn, autocommit=True) as db:
        db.execute(
            f'INSERT INTO "{site.schema}"."{site.billing}" (id, expires, headers, body) '
            "VALUES (%s, NULL, %s, %s)",
            ("0b7b3f36-7d44-4f1f-9c40-5a3f0e6a6f11", '{"Shop.Kind":"native"}', b"native"),
        )
    await asyncio.to_thread(site.run)

    properties, headers = site.take(site.billing)
    assert properties.message_id == request
    assert headers["NServiceBus.ReplyToAddress"] == site.sales == properties.reply_to
    assert headers[TRANSFER] == "pg->rabbit"
    native, _ = site.take(site.billing)
    assert native.message_id == "0b7b3f36-7d44-4f1f-9c40-5a3f0e6a6f11"

    # Billing (RabbitMQ) replies to the address it was given: the Sales proxy on RabbitMQ.
    site.publish(
        properties.reply_to,
        {
            "NServiceBus.MessageId": "reply-1",
            "NServiceBus.MessageIntent": "Reply",
            "NServiceBus.CorrelationId": "c-1",
            "NServiceBus.ReplyToAddress": site.billing,
        },
    )
    await asyncio.to_thread(site.run)
    [reply] = await site.drain_pg(site.sales)
    assert reply.message_id == "reply-1"
    assert reply.headers.get("NServiceBus.ReplyToAddress") == site.address(site.billing)
    assert reply.headers.get(TRANSFER) == "rabbit->pg"
    assert reply.headers.get("NServiceBus.CorrelationId") == "c-1"


async def test_a_servicepulse_retry_crosses_back_with_its_acknowledgement_translated(
    site: Site,
) -> None:
    bridge(site.config, "install")
    # Billing fails a message: its error copy goes to the error queue on its own broker (the
    # proxy of ServiceControl's error queue), FailedQ = its own queue; its type has a short
    # TimeToBeReceived and it was sent long ago: an error copy never expires (product.md).
    site.publish(
        site.error,
        {
            "NServiceBus.MessageId": "failed-1",
            "NServiceBus.FailedQ": site.billing,
            "NServiceBus.ReplyToAddress": site.sales,
            "NServiceBus.TimeToBeReceived": "00:00:01",
            "NServiceBus.TimeSent": "2020-01-01 00:00:00:000000 Z",
            "NServiceBus.ExceptionInfo.ExceptionType": "System.InvalidOperationException",
            "NServiceBus.ExceptionInfo.Message": "boom",
            "NServiceBus.ProcessingEndpoint": site.billing,
        },
    )
    await asyncio.to_thread(site.run)
    [copy] = await site.drain_pg(site.error)
    assert copy.headers.get("NServiceBus.FailedQ") == site.address(site.billing)
    assert copy.headers.get("NServiceBus.ReplyToAddress") == site.address(site.sales)
    assert copy.headers.get("NServiceBus.TimeToBeReceived") == "00:00:01"
    assert TRANSFER not in copy.headers

    # ServicePulse retries it: ServiceControl (on PostgreSQL) sends it to its FailedQ, which is
    # the Billing proxy table, asking for an acknowledgement in its own queue.
    retry = Headers(
        [
            *[(k, v) for k, v in copy.headers if not k.startswith("NServiceBus.ExceptionInfo")],
            ("ServiceControl.Retry.UniqueMessageId", "u-1"),
            ("ServiceControl.Retry.AcknowledgementQueue", site.address(site.control)),
        ]
    )
    retry.remove("NServiceBus.FailedQ")
    sink = site.pg.sink(site.billing)
    await sink.send([Envelope(retry, copy.body)])
    await sink.close()
    await asyncio.to_thread(site.run)
    _, headers = site.take(site.billing)
    assert headers["ServiceControl.Retry.AcknowledgementQueue"] == site.control
    assert headers["NServiceBus.ReplyToAddress"] == site.sales

    # Billing acknowledges where it was told: the ServiceControl proxy on RabbitMQ.
    site.publish(
        headers["ServiceControl.Retry.AcknowledgementQueue"],
        {"NServiceBus.MessageId": "ack-1", "ServiceControl.Retry.Successful": "true"},
    )
    await asyncio.to_thread(site.run)
    [ack] = await site.drain_pg(site.control)
    assert ack.message_id == "ack-1"


async def test_an_unknown_reply_address_sends_the_message_to_the_error_queue(site: Site) -> None:
    bridge(site.config, "install")
    good = await site.send_pg(
        site.billing, ("NServiceBus.ReplyToAddress", site.address(site.sales))
    )
    wrong_case = site.address(site.sales.lower())
    bad = await site.send_pg(site.billing, ("NServiceBus.ReplyToAddress", wrong_case))
    await asyncio.to_thread(site.run)
    properties, _ = site.take(site.billing)
    assert properties.message_id == good
    [failed] = await site.drain_pg(site.poison)
    assert failed.message_id == bad
    assert failed.headers.get("NServiceBus.FailedQ") == site.address(site.billing)
    reason = failed.headers.get("NServiceBus.ExceptionInfo.Message") or ""
    assert f"NServiceBus.ReplyToAddress {wrong_case!r}" in reason
    assert f"nearest: {site.sales!r}, which differs only in case" in reason
    assert failed.headers.get("NServiceBus.ReplyToAddress") == wrong_case  # kept as it was


async def test_kafka_and_sqlite_endpoints_reach_each_other(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    orders, analytics = unique("Orders"), unique("Analytics")
    config = tmp_path / "routes.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            connections:
              lite: {{type: sqlite, path: "{tmp_path / "queues.db"}"}}
              kafka: {{type: kafka, bootstrap_servers: "{kafka_bootstrap}", idempotence: false,
                       session_timeout_ms: 6000}}
            endpoints:
              {orders}: {{connection: lite}}
              {analytics}: {{connection: kafka}}
            proxies: {{create: true, group: {unique("g")}, error_queue: {unique("poison")}}}
            """
        )
    )
    connections = load_config(config).config.connections
    lite = load("lite", connections["lite"])
    kafka = load("kafka", connections["kafka"])
    try:
        await lite.install([orders])
        await kafka.install([analytics])
        bridge(config, "install")
        # Orders (SQLite) sends to Analytics through its proxy table; Analytics answers on the
        # Orders proxy topic.
        sink = lite.sink(analytics)
        await sink.send(
            [
                Envelope(
                    Headers(
                        [("NServiceBus.MessageId", "o-1"), ("NServiceBus.ReplyToAddress", orders)]
                    ),
                    b"{}",
                )
            ]
        )
        await sink.close()
        producer = kafka.sink(orders)
        await producer.send(
            [
                Envelope(
                    Headers(
                        [
                            ("NServiceBus.MessageId", "a-1"),
                            ("NServiceBus.ReplyToAddress", analytics),
                        ]
                    ),
                    b"{}",
                )
            ]
        )
        await producer.close()
        await asyncio.to_thread(bridge, config, "run", "--until-idle", "4")

        source = kafka.source(analytics, group=unique("reader"))
        try:
            batch = await source.receive_batch(10, 10.0)
            async with batch:
                [record] = batch.messages
                await batch.commit()
        finally:
            await source.close()
        assert record.message_id == "o-1"
        assert record.headers.get("NServiceBus.ReplyToAddress") == orders  # the Orders proxy topic
        assert record.headers.get(TRANSFER) == "lite->kafka"

        rows = lite.source(orders)
        try:
            batch = await rows.receive_batch(10, 1.0)
            async with batch:
                [row] = batch.messages
                await batch.commit()
        finally:
            await rows.close()
        assert row.message_id == "a-1"
        assert row.headers.get("NServiceBus.ReplyToAddress") == f'"main"."{analytics}"'
        assert row.headers.get(TRANSFER) == "kafka->lite"
    finally:
        await lite.close()
        await kafka.close()


def test_without_create_install_leaves_proxies_alone_and_check_says_which_are_missing(
    tmp_path: Path,
) -> None:
    config = tmp_path / "routes.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            connections:
              old: {{type: sqlite, path: "{tmp_path / "old.db"}"}}
              new: {{type: sqlite, path: "{tmp_path / "new.db"}"}}
            endpoints:
              Sales: {{connection: old}}
              Billing: {{connection: new}}
            """
        )
    )
    installed = bridge(config, "install").stdout
    assert "Sales" not in installed and "Billing" not in installed  # the endpoints' and proxies'
    checked = bridge(config, "check", "--connect", check=False)
    assert checked.returncode == 1
    assert checked.stdout.startswith(
        f"{config}: OK (2 connections, 0 routes, 2 derived from 2 endpoints)\n"
    )
    assert "old: note: Billing is a proxy, which `bridge install` creates only with " in (
        checked.stdout
    )
    assert "new: note: Sales is a proxy" in checked.stdout
