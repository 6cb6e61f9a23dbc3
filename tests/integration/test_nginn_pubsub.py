"""NGinn tables in publish/subscribe, through real `bridge install` and `bridge run` processes
on PostgreSQL, SQLite, RabbitMQ and the local Kafka broker.

The NGinn side is played as NGinn.MessageBus does it (lafar6502/nginn-messagebus @1fa4baf,
`NGinnBPM.MessageBus/`, replayed by `tests/support/nginn.py`):
- the publisher reads its subscribers with `SqlSubscriptionService_GetSubscriptions`
  (Impl/SqlQueue/NamedQueries.sqlserver.json:27), walks its event's class chain up to
  System.Object (Impl/MessageBus.cs:264-287) and inserts one row per subscriber endpoint with
  `from_endpoint` its own endpoint (MessageBus.cs:347-371);
- a subscriber takes rows with `SelectAndLockNext1/2` (NamedQueries.sqlserver.json:2-4);
- a subscription row is `(publisher_endpoint, subscriber_endpoint, message_type, created_date =
  the server's local now, expiration_date)` (SqlSubscriptionService.cs:104-134,
  NamedQueries.sqlserver.json:28-29).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from bridge.config.loader import load_config
from bridge.envelope import Envelope, Headers
from bridge.protocols import Transport
from bridge.transports import load
from tests.conftest import unique
from tests.integration.test_registry import bridge
from tests.support.nginn import NGinn
from tests.support.queues import drain

pytestmark = pytest.mark.integration

INTENT = "NServiceBus.MessageIntent"
ENCLOSED = "NServiceBus.EnclosedMessageTypes"
ZONE = "Europe/Warsaw"  # never UTC: a UTC created_date would be an hour or two off
SUBSCRIPTIONS = "NGinnMessageBus_Subscriptions"


class Site:
    """Legacy publishes on NGinn tables in PostgreSQL; Shipping (RabbitMQ), Billing (NServiceBus
    tables in PostgreSQL) and Analytics (Kafka) subscribe to its base event. Inventory publishes
    on Kafka; Books, on NGinn tables in SQLite, subscribes."""

    def __init__(
        self,
        tmp_path: Path,
        dsn: str,
        schemas: tuple[str, str],
        url: str,
        kafka: str,
        names: Callable[..., str],
    ) -> None:
        self.dsn, (self.ng_schema, self.pg_schema) = dsn, schemas
        for role in ("legacy", "shipping", "billing", "analytics", "inventory", "books"):
            setattr(self, role, names(role.capitalize()))
        ns = unique("T")
        self.placed = f"{ns}.Legacy.OrderPlaced"
        self.express = f"{ns}.Legacy.ExpressOrderPlaced"  # derives from OrderPlaced
        self.stock = f"{ns}.Inventory.StockChanged"
        self.lite_path = tmp_path / "ng.db"
        self.config = tmp_path / "routes.yaml"
        self.config.write_text(
            textwrap.dedent(
                f"""\
                connections:
                  ng: {{type: postgresql, dsn: "{dsn}", schema: "{self.ng_schema}",
                        layout: nginn, nginn: {{alias: db, timezone: {ZONE}}}}}
                  pg: {{type: postgresql, dsn: "{dsn}", schema: "{self.pg_schema}"}}
                  rabbit: {{type: rabbitmq, url: "{url}", queue_type: quorum}}
                  kafka: {{type: kafka, bootstrap_servers: "{kafka}", idempotence: false,
                           session_timeout_ms: 3000}}
                  lite: {{type: sqlite, path: "{self.lite_path}", layout: nginn,
                          nginn: {{alias: lite, timezone: UTC,
                                   types: {{{self.stock}: "Inv.StockChanged, Inv"}}}}}}
                endpoints:
                  {self.legacy}: {{connection: ng}}
                  {self.inventory}: {{connection: kafka}}
                  {self.shipping}:
                    connection: rabbit
                    subscribes: [{{event: {self.placed}, publisher: {self.legacy}}}]
                  {self.billing}:
                    connection: pg
                    subscribes: [{{event: {self.placed}, publisher: {self.legacy}}}]
                  {self.analytics}:
                    connection: kafka
                    subscribes: [{{event: {self.placed}, publisher: {self.legacy}}}]
                  {self.books}:
                    connection: lite
                    subscribes: [{{event: {self.stock}, publisher: {self.inventory}}}]
                proxies: {{create: true, connections: [ng, pg, rabbit, kafka],
                           group: {unique("g")}, error_queue: {unique("poison")}}}
                """
            )
        )
        connections = load_config(self.config).config.connections
        self.transports: dict[str, Transport] = {
            name: load(name, connections[name]) for name in ("ng", "pg", "rabbit", "kafka")
        }
        self.publisher = NGinn("postgresql", f"{dsn}|{self.ng_schema}", self.legacy, ZONE)

    def __getitem__(self, name: str) -> Transport:
        return self.transports[name]

    def ng_rows(self) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn) as db:
            return [
                tuple(row)
                for row in db.execute(
                    "SELECT publisher_endpoint, subscriber_endpoint, message_type, created_date, "
                    f'expiration_date FROM "{self.ng_schema}"."{SUBSCRIPTIONS}" '
                    "ORDER BY subscriber_endpoint"
                )
            ]

    def lite_rows(self) -> list[tuple[Any, ...]]:
        with sqlite3.connect(self.lite_path) as db:
            return db.execute(
                "SELECT publisher_endpoint, subscriber_endpoint, message_type, created_date, "
                f"expiration_date FROM {SUBSCRIPTIONS}"
            ).fetchall()

    async def read_topic(self, topic: str, expect: int) -> list[Envelope]:
        """The records of `topic`, reading until `expect` came and 3 s more (10 s at most)."""
        source = self["kafka"].source(topic, group=unique("reader"))
        got: list[Envelope] = []
        deadline, quiet = time.monotonic() + 10, None
        try:
            while time.monotonic() < deadline and (quiet is None or time.monotonic() < quiet):
                batch = await source.receive_batch(100, 1.0)
                async with batch:
                    got.extend(batch.messages)
                    await batch.commit()
                if len(got) >= expect and quiet is None:
                    quiet = time.monotonic() + 3
        finally:
            await source.close()
        return got

    async def close(self) -> None:
        for transport in self.transports.values():
            await transport.close()


@pytest.fixture
async def site(
    tmp_path: Path,
    pg_dsn: str,
    pg_schema: str,
    rabbitmq_url: str,
    kafka_bootstrap: str,
    rabbitmq_queues: Callable[..., str],
) -> AsyncIterator[Site]:
    ng_schema = unique("ng")
    with psycopg.connect(pg_dsn, autocommit=True) as db:
        db.execute(f'CREATE SCHEMA "{ng_schema}"')
    s = Site(
        tmp_path, pg_dsn, (ng_schema, pg_schema), rabbitmq_url, kafka_bootstrap, rabbitmq_queues
    )
    await s["ng"].install([s.legacy])
    await s["pg"].install([s.billing])
    await s["rabbit"].install([s.shipping])
    await s["kafka"].install([s.analytics, s.inventory])
    lite = load("lite", load_config(s.config).config.connections["lite"])
    await lite.install([s.books])
    await lite.close()
    try:
        yield s
    finally:
        await s.close()
        with psycopg.connect(pg_dsn, autocommit=True) as db:
            db.execute(f'DROP SCHEMA "{ng_schema}" CASCADE')


def plausible_local_now(created: datetime, zone: str) -> bool:
    now = datetime.now(ZoneInfo(zone)).replace(tzinfo=None)
    return abs(created - now) < timedelta(minutes=2)


async def test_nginn_tables_publish_and_subscribe_across_every_transport(site: Site) -> None:
    s = site
    printed = bridge(s.config, "install", "--print-sql").stdout
    assert f'CREATE TABLE IF NOT EXISTS "{s.ng_schema}"."{SUBSCRIPTIONS}"' in printed
    installed = bridge(s.config, "install").stdout
    assert f"ng: subscribed {s.shipping} to {s.placed} at sql://db/{s.shipping}" in installed

    # The rows NGinn would write when each proxy subscribes from its own endpoint (Analytics,
    # on Kafka, through its proxy: the event goes to Kafka once).
    rows = s.ng_rows()
    assert [r[:3] for r in rows] == sorted(
        (f"sql://db/{s.legacy}", f"sql://db/{sub}", s.placed)
        for sub in (s.shipping, s.billing, s.analytics)
    )
    assert all(r[4] is None and plausible_local_now(r[3], ZONE) for r in rows), rows
    # A Kafka publisher's event on NGinn tables: Books subscribes as it would itself, from
    # Inventory's endpoint there; the message type is NGinn's name of the event.
    [lite_row] = s.lite_rows()
    assert lite_row[:3] == (
        f"sql://lite/{s.inventory}",
        f"sql://lite/{s.books}",
        "Inv.StockChanged",
    )
    assert lite_row[4] is None
    assert plausible_local_now(datetime.fromisoformat(lite_row[3]), "UTC")
    bridge(s.config, "install")  # again: nothing doubles, nothing changes
    assert s.ng_rows() == rows and s.lite_rows() == [lite_row]

    # Legacy publishes a derived event as NGinn does: one row per subscriber endpoint.
    body = json.dumps({"$type": f"{s.express}, Legacy", "OrderId": 7})
    targets = s.publisher.notify(
        body, [s.express, s.placed, "System.Object"], SUBSCRIPTIONS, ["u-1", "u-2", "u-3"]
    )
    assert len(targets) == 3
    # Inventory publishes on Kafka: once, to its event's topic.
    producer = s["kafka"].sink(s.stock.replace("+", "_"))
    headers = Headers(
        [
            ("NServiceBus.MessageId", "stock-1"),
            (INTENT, "Publish"),
            (ENCLOSED, f"{s.stock}, Inv"),
            ("NServiceBus.ContentType", "application/json"),
        ]
    )
    await producer.send([Envelope(headers, b'{"Sku": "A-1"}')])
    await producer.close()

    await asyncio.to_thread(bridge, s.config, "run", "--until-idle", "4")

    assert s.ng_rows() == rows and s.lite_rows() == [lite_row]  # `run` subscribed again
    [shipped] = await drain(s["rabbit"], s.shipping)
    [billed] = await drain(s["pg"], s.billing)
    for got in (shipped, billed):
        assert got.headers.get(INTENT) == "Publish"
        assert got.headers.get(ENCLOSED) == f"{s.express}, Legacy;{s.placed}"
    assert {shipped.message_id, billed.message_id} <= {"u-1", "u-2", "u-3"}
    # Once, on the topic of the subscribed event; nothing on the Analytics proxy's own.
    [to_kafka] = await s.read_topic(s.placed, 1)
    assert to_kafka.headers.get(INTENT) == "Publish"
    assert (await s["kafka"].peek(s.analytics)).depth == 0

    # Books takes Inventory's event as NGinn receives a row.
    books = NGinn("sqlite", str(s.lite_path), s.books, "UTC", alias="lite")
    received = books.receive()
    assert received is not None and books.receive() is None
    assert (received.from_endpoint, received.to_endpoint) == (
        f"sql://lite/{s.inventory}",
        f"sql://lite/{s.books}",
    )
    assert received.unique_id == "stock-1"
    assert json.loads(received.body) == {"$type": "Inv.StockChanged, Inv", "Sku": "A-1"}

    shown = json.loads(bridge(s.config, "endpoints", "--json", "--connect").stdout)
    states = {
        (e["name"], x["kind"]): x["state"] for e in shown["endpoints"] for x in e["subscriptions"]
    }
    assert states == {
        (s.shipping, "proxy"): "subscribed",
        (s.billing, "proxy"): "subscribed",
        (s.analytics, "kafka"): "subscribed",
        (s.books, "home"): "subscribed",
    }
    # By hand: unsubscribe Shipping and its row is gone; subscribe and it is back, new.
    bridge(s.config, "unsubscribe", "--endpoint", s.shipping, "--event", s.placed)
    assert len(s.ng_rows()) == 2
    bridge(s.config, "subscribe", "--endpoint", s.shipping, "--event", s.placed)
    assert [r[:3] for r in s.ng_rows()] == [r[:3] for r in rows]
