"""Publish/subscribe across PostgreSQL, RabbitMQ, SQLite and Kafka, through real `bridge
install` and `bridge run` processes.

The publishers are played as NServiceBus's publish:
- on PostgreSQL, the SQL transport's: the topics of the event's type hierarchy (itself, its base
  types, `System.Object`) looked up with `SELECT DISTINCT QueueAddress FROM SubscriptionRouting
  WHERE Topic IN (...)` and one copy sent to each address (Particular/NServiceBus.SqlServer
  @214c4e8f src/NServiceBus.Transport.Sql.Shared/PubSub/PolymorphicSubscriptionStore.cs:17-57,
  MulticastToUnicastConverter.cs:14-26; PostgreSqlConstants.cs:149-153);
- on RabbitMQ, the conventional topology's: the event's fanout exchange `Namespace:Name`, bound
  to its base types' exchanges, published to with mandatory=false (Particular/NServiceBus.RabbitMQ
  @ec745bf8 src/NServiceBus.Transport.RabbitMQ/Routing/ConventionalRoutingTopology.cs:54-58,
  93-121);
- on Kafka, this project's convention: once to the topic of the event's type (spec §2).

What the bridge writes is compared with what NServiceBus itself would write: a SubscriptionRouting
row (Endpoint = the subscriber, QueueAddress = its proxy's address, or for Kafka subscribers
their event queue's, Topic = the subscribed type's
full name: SubscriptionManager.cs:9-11 and SubscriptionTable.cs:27-40 there, and the Messaging
Bridge's proxies named like their endpoints: EndpointProxyFactory.cs:22-23 of
Particular/NServiceBus.MessagingBridge@ef463cf); on RabbitMQ the event's exchange bound to the
subscriber's exchange with routing key "" (ConventionalRoutingTopology.cs:29-36) and to
`System:Object`'s, the base of the type the Messaging Bridge subscribes with
(RuntimeTypeGenerator.cs:57-81 there; ConventionalRoutingTopology.cs:93-110).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import textwrap
import time
import urllib.error
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import psycopg
import pytest

from bridge.config.loader import load_config
from bridge.envelope import Envelope, Headers
from bridge.protocols import Transport
from bridge.transports import load
from tests.conftest import unique
from tests.faults import BridgeProcess, report
from tests.integration.test_registry import bridge
from tests.support.management import api
from tests.support.queues import drain

pytestmark = pytest.mark.integration

INTENT = "NServiceBus.MessageIntent"
ENCLOSED = "NServiceBus.EnclosedMessageTypes"


def enclosed(*types: str) -> str:
    return ";".join(
        f"{t}, Events, Version=1.0.0.0, Culture=neutral, PublicKeyToken=null" for t in types
    )


def event(message_id: str, *types: str) -> Envelope:
    headers = Headers(
        [
            ("NServiceBus.MessageId", message_id),
            (INTENT, "Publish"),
            (ENCLOSED, enclosed(*types)),
            ("NServiceBus.ContentType", "application/json"),
        ]
    )
    return Envelope(headers, b'{"OrderId": 1}')


class Site:
    """Sales publishes on PostgreSQL, Warehouse on RabbitMQ, Inventory on Kafka; subscribers
    live on every transport, SQLite too."""

    def __init__(
        self, tmp_path: Path, dsn: str, schema: str, url: str, kafka: str, names: Callable[..., str]
    ) -> None:
        self.dsn, self.schema, self.url = dsn, schema, url
        for role in ("sales", "billing", "shipping", "warehouse", "analytics", "audit"):
            setattr(self, role, names(role.capitalize()))
        self.inventory, self.ledger = names("Inventory"), names("Ledger")
        ns = unique("T")
        self.placed = f"{ns}.Sales.OrderPlaced"
        self.express = f"{ns}.Sales.ExpressOrderPlaced"  # derives from OrderPlaced
        # A short name of its own: the Kafka subscribers' event queue on the shared broker is
        # named from it (`kafka_<ShortName>`).
        shipped = f"Shipped{uuid.uuid4().hex[:8]}"
        self.shipped = f"{ns}.Warehouse.{shipped}"
        self.stock = f"{ns}.Inventory.StockChanged"
        self.stock_topic = unique("stock-changed")
        self.legacy_topic = unique("legacy-stock")  # read by a written route that publishes
        self.exchanges = [
            f"{ns}.{x}"
            for x in (
                "Sales:OrderPlaced",
                "Sales:ExpressOrderPlaced",
                f"Warehouse:{shipped}",
                "Inventory:StockChanged",
            )
        ]
        self.lite_path = tmp_path / "lite.db"
        self.config = tmp_path / "routes.yaml"
        self.config.write_text(
            textwrap.dedent(
                f"""\
                connections:
                  pg: {{type: postgresql, dsn: "{dsn}", schema: "{schema}"}}
                  rabbit: {{type: rabbitmq, url: "{url}", queue_type: quorum}}
                  kafka: {{type: kafka, bootstrap_servers: "{kafka}", idempotence: false,
                           session_timeout_ms: 3000}}
                  lite: {{type: sqlite, path: "{tmp_path / "lite.db"}"}}
                endpoints:
                  {self.sales}: {{connection: pg}}
                  {self.warehouse}: {{connection: rabbit}}
                  {self.inventory}: {{connection: kafka}}
                  {self.billing}:
                    connection: pg
                    subscribes:
                      - {{event: {self.shipped}, publisher: {self.warehouse}}}
                      - {{event: {self.stock}, publisher: {self.inventory}}}
                  {self.shipping}:
                    connection: rabbit
                    subscribes:
                      - {{event: {self.placed}, publisher: {self.sales}}}
                      - {{event: {self.stock}, publisher: {self.inventory}}}
                  {self.analytics}:
                    connection: kafka
                    subscribes: [{{event: {self.placed}, publisher: {self.sales}}}]
                  {self.audit}:
                    connection: kafka
                    subscribes:
                      - {{event: {self.placed}, publisher: {self.sales}}}
                      - {{event: {self.shipped}, publisher: {self.warehouse}}}
                  {self.ledger}:
                    connection: lite
                    subscribes:
                      - {{event: {self.placed}, publisher: {self.sales}}}
                      - {{event: {self.stock}, publisher: {self.inventory}}}
                events:
                  {self.stock}: {{topic: {self.stock_topic}}}
                routes:
                  - name: legacy-stock
                    from: {{connection: kafka, topic: {self.legacy_topic}, group: {unique("g")}}}
                    to: {{connection: lite}}
                    publish: true
                proxies: {{create: true, group: {unique("g")}, error_queue: {unique("poison")},
                           batch_size: 50}}
                """
            )
        )
        config = load_config(self.config).config
        connections = config.connections
        #: The Kafka subscribers' event queues, by connection of the publisher.
        self.event_queues = {
            s.connection: s.table
            for s in config.registry.pubsub.subscriptions()
            if s.kind == "kafka" and s.table is not None
        }
        self.transports: dict[str, Transport] = {
            name: load(name, connections[name]) for name in ("pg", "rabbit", "kafka", "lite")
        }
        self._connections: list[Any] = []

    def __getitem__(self, name: str) -> Transport:
        return self.transports[name]

    def address(self, table: str) -> str:
        return f'"{self.schema}"."{table}"'

    def rows(self) -> list[tuple[str, str, str]]:
        with psycopg.connect(self.dsn) as db:
            return [
                tuple(row)  # type: ignore[misc]
                for row in db.execute(
                    "SELECT endpoint, topic, queueaddress "
                    f'FROM "{self.schema}"."SubscriptionRouting" ORDER BY endpoint, topic'
                )
            ]

    async def publish_pg(self, message: Envelope, *types: str) -> int:
        """As the SQL transport publishes: look the subscribers up, one copy per address."""
        topics = [*types, "System.Object"]
        with psycopg.connect(self.dsn) as db:
            addresses = [
                row[0]
                for row in db.execute(
                    "SELECT DISTINCT QueueAddress "
                    f'FROM "{self.schema}"."SubscriptionRouting" '
                    f"WHERE Topic IN ({', '.join(['%s'] * len(topics))})",
                    topics,
                )
            ]
        for address in addresses:
            table = address.split(".", 1)[1].strip('"')
            sink = self["pg"].sink(table)
            await sink.send([message])
            await sink.close()
        return len(addresses)

    def channel(self) -> Any:
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        self._connections.append(connection)
        return connection.channel()

    def publish_rabbit(self, message: Envelope, exchange: str) -> None:
        """As the conventional topology publishes a type with no base but System.Object."""
        channel = self.channel()
        channel.confirm_delivery()
        channel.exchange_declare(exchange, "fanout", durable=True)
        channel.exchange_declare("System:Object", "fanout", durable=True)
        channel.exchange_bind("System:Object", exchange, "")
        headers = dict(message.headers)
        properties = pika.BasicProperties(
            message_id=message.message_id, delivery_mode=2, headers=headers
        )
        channel.basic_publish(exchange, "", message.body, properties, mandatory=False)

    def bindings(self, exchange: str) -> list[tuple[str, str, str]]:
        found = api("GET", f"exchanges/%2F/{quote(exchange, safe='')}/bindings/source")
        return sorted((b["destination_type"], b["destination"], b["routing_key"]) for b in found)

    async def read_topic(self, topic: str, expect: int) -> list[Envelope]:
        """The first `expect` records of `topic` (10 s at most)."""
        source = self["kafka"].source(topic, group=unique("reader"))
        got: list[Envelope] = []
        deadline = time.monotonic() + 10
        try:
            while len(got) < expect and time.monotonic() < deadline:
                batch = await source.receive_batch(100, 1.0)
                async with batch:
                    got.extend(batch.messages)
                    await batch.commit()
        finally:
            await source.close()
        return got

    async def wait_for_depth(self, queue: str, depth: int, every: float) -> None:
        """Until the RabbitMQ queue holds `depth` messages, for at most a minute."""
        for _ in range(int(60 / every)):
            if (await self["rabbit"].peek(queue)).depth >= depth:
                return
            await asyncio.sleep(every)

    async def wait_for_rows(
        self, table: str, depth: int, every: float, *, drained: bool = False
    ) -> None:
        """Until the PostgreSQL table holds `depth` rows (`drained`: at most), for at most a
        minute."""
        for _ in range(int(60 / every)):
            found = (await self["pg"].peek(table)).depth
            if (found <= depth) if drained else (found >= depth):
                return
            await asyncio.sleep(every)

    async def close(self) -> None:
        for transport in self.transports.values():
            await transport.close()
        for connection in self._connections:
            if connection.is_open:
                connection.close()
        channel = pika.BlockingConnection(pika.URLParameters(self.url))
        cleanup = channel.channel()
        for exchange in self.exchanges:
            cleanup.exchange_delete(exchange)
        cleanup.queue_delete(self.event_queues["rabbit"])
        cleanup.exchange_delete(self.event_queues["rabbit"])
        channel.close()


@pytest.fixture
async def site(
    tmp_path: Path,
    pg_dsn: str,
    pg_schema: str,
    rabbitmq_url: str,
    kafka_bootstrap: str,
    rabbitmq_queues: Callable[..., str],
) -> AsyncIterator[Site]:
    s = Site(tmp_path, pg_dsn, pg_schema, rabbitmq_url, kafka_bootstrap, rabbitmq_queues)
    # The endpoints' own queues are theirs: created as their installers would.
    await s["pg"].install([s.sales, s.billing])
    await s["rabbit"].install([s.shipping, s.warehouse])
    await s["kafka"].install([s.analytics, s.audit, s.inventory, s.legacy_topic])
    await s["lite"].install([s.ledger])
    yield s
    await s.close()


async def test_events_cross_every_pair_once_each(site: Site) -> None:
    s = site
    installed = bridge(s.config, "install").stdout
    assert f"pg: subscribed {s.shipping} to {s.placed} at {s.address(s.shipping)}" in installed
    # The rows NServiceBus would write for each proxy; the Kafka subscribers share one address,
    # their event queue's, named from the Kafka connection and the event alone.
    pg_events, rabbit_events = s.event_queues["pg"], s.event_queues["rabbit"]
    assert pg_events == "kafka_OrderPlaced" and rabbit_events == f"kafka_{s.shipped.split('.')[-1]}"
    expected = sorted(
        [
            (s.analytics, s.placed, s.address(pg_events)),
            (s.audit, s.placed, s.address(pg_events)),
            # Billing subscribes to an event published on Kafka: subscribed at home, as it
            # would subscribe itself (its own address), so that the bridge's publish finds it.
            (s.billing, s.stock, s.address(s.billing)),
            (s.ledger, s.placed, s.address(s.ledger)),
            (s.shipping, s.placed, s.address(s.shipping)),
        ]
    )
    assert s.rows() == expected
    with sqlite3.connect(s.lite_path) as db:
        assert db.execute(
            "SELECT Endpoint, Topic, QueueAddress FROM SubscriptionRouting"
        ).fetchall() == [(s.ledger, s.stock, f'"main"."{s.ledger}"')]
    bridge(s.config, "install")  # again: nothing doubles
    assert s.rows() == expected
    checked = bridge(s.config, "check", "--connect").stdout  # the event topics, no event tables
    assert "kafka: OK (" in checked and s.placed in checked and s.stock_topic in checked
    shipped_exchange = s.exchanges[2]
    # As NServiceBus subscribes the Messaging Bridge's type of the event: to System.Object too.
    # and, for the Kafka subscriber, to its event queue's exchange (declared with the proxies).
    assert s.bindings(shipped_exchange) == sorted(
        [
            ("exchange", "System:Object", ""),
            ("exchange", s.billing, ""),
            ("exchange", rabbit_events, ""),
        ]
    )
    shown_exchange = api("GET", f"exchanges/%2F/{quote(shipped_exchange, safe='')}")
    assert (shown_exchange["type"], shown_exchange["durable"]) == ("fanout", True)
    assert ("exchange", s.shipping, "") in s.bindings(s.exchanges[3])

    # Sales publishes a derived event on PostgreSQL: Shipping and Ledger each get one copy in
    # their proxy tables, Analytics and Audit one in their event queue.
    copies = await s.publish_pg(event("express-1", s.express, s.placed), s.express, s.placed)
    assert copies == 3
    # Warehouse publishes on RabbitMQ; Inventory produces to its event's topic on Kafka.
    s.publish_rabbit(event("shipped-1", s.shipped), shipped_exchange)
    producer = s["kafka"].sink(s.stock_topic)
    await producer.send([event("stock-1", s.stock)])
    await producer.close()
    # A topic no registered endpoint publishes to, published on SQLite by a written route.
    producer = s["kafka"].sink(s.legacy_topic)
    await producer.send([event("legacy-1", s.stock)])
    await producer.close()

    # A Subscribe control message an endpoint sent to the Shipping proxy: dropped there.
    sink = s["pg"].sink(s.shipping)
    control = [("NServiceBus.MessageId", "subscribe-1"), (INTENT, "Subscribe")]
    await sink.send([Envelope(Headers(control), b"")])
    await sink.close()

    await asyncio.to_thread(bridge, s.config, "run", "--until-idle", "4")

    shipping = await drain(s["rabbit"], s.shipping)
    assert sorted(m.message_id for m in shipping) == ["express-1", "stock-1"]  # no control
    assert all(m.headers.get(INTENT) == "Publish" for m in shipping)
    billing = await drain(s["pg"], s.billing)
    assert sorted(m.message_id for m in billing) == ["shipped-1", "stock-1"]
    ledger = await drain(s["lite"], s.ledger)
    assert sorted(m.message_id for m in ledger) == ["express-1", "legacy-1", "stock-1"]
    # Once, not once per subscriber; and not to a subscriber's own topic.
    assert (await s["kafka"].peek(s.placed)).depth == 1  # the subscribed type's derived topic
    assert (await s["kafka"].peek(s.analytics)).depth == 0
    assert (await s["kafka"].peek(s.audit)).depth == 0
    [to_kafka] = await s.read_topic(s.placed, 1)
    assert to_kafka.message_id == "express-1"
    assert to_kafka.headers.get(ENCLOSED) == enclosed(s.express, s.placed)
    assert to_kafka.headers.get(INTENT) == "Publish"
    # Published on RabbitMQ: once to its topic, through the event queue's route.
    assert (await s["kafka"].peek(s.shipped)).depth == 1
    [shipped] = await s.read_topic(s.shipped, 1)
    assert shipped.message_id == "shipped-1"
    assert shipped.headers.get(ENCLOSED) == enclosed(s.shipped)
    # The bridge published StockChanged on RabbitMQ as a publisher without .NET types must.
    assert ("exchange", "System:Object", "") in s.bindings(s.exchanges[3])

    shown = json.loads(bridge(s.config, "endpoints", "--json", "--connect").stdout)
    audit = next(e for e in shown["endpoints"] if e["name"] == s.audit)
    assert audit["subscriptions"] == [
        {
            "event": s.placed,
            "publisher": s.sales,
            "kind": "kafka",
            "connection": "pg",
            "address": s.address(pg_events),
            "topic": s.placed,
            "queue": pg_events,
            "route": f"events.pg.{pg_events}",
            "state": "subscribed",
        },
        {
            "event": s.shipped,
            "publisher": s.warehouse,
            "kind": "kafka",
            "connection": "rabbit",
            "address": rabbit_events,
            "topic": s.shipped,
            "queue": rabbit_events,
            "route": f"events.rabbit.{rabbit_events}",
            "state": "subscribed",
        },
    ]
    # One Kafka subscriber unsubscribed: its row goes, the other's stays at the event queue.
    bridge(s.config, "unsubscribe", "--endpoint", s.audit, "--event", s.placed)
    assert s.rows() == [r for r in expected if r[0] != s.audit]
    bridge(s.config, "subscribe", "--endpoint", s.audit, "--event", s.placed)
    assert s.rows() == expected

    shipping_shown = next(e for e in shown["endpoints"] if e["name"] == s.shipping)
    assert [x["state"] for x in shipping_shown["subscriptions"]] == ["subscribed", "subscribed"]
    billing_shown = next(e for e in shown["endpoints"] if e["name"] == s.billing)
    assert [(x["kind"], x["state"]) for x in billing_shown["subscriptions"]] == [
        ("proxy", "subscribed"),  # Shipped: the exchange bound to the proxy's, on RabbitMQ
        ("home", "subscribed"),  # StockChanged: its own row on PostgreSQL
    ]
    # By hand: unsubscribe Shipping, and its row is gone; subscribe, and it is back.
    bridge(s.config, "unsubscribe", "--endpoint", s.shipping, "--event", s.placed)
    assert (s.shipping, s.placed, s.address(s.shipping)) not in s.rows()
    bridge(s.config, "subscribe", "--endpoint", s.shipping, "--event", s.placed)
    assert s.rows() == expected
    # On RabbitMQ the binding goes, twice without complaint, and comes back.
    for _ in range(2):
        bridge(s.config, "unsubscribe", "--endpoint", s.billing, "--event", s.shipped)
        assert s.bindings(shipped_exchange) == sorted(
            [("exchange", "System:Object", ""), ("exchange", rabbit_events, "")]
        )
    bridge(s.config, "subscribe", "--endpoint", s.billing, "--event", s.shipped)
    assert ("exchange", s.billing, "") in s.bindings(shipped_exchange)
    # A binding of the event's exchange to a Kafka subscriber's proxy as well (what a bridge
    # made before Kafka subscribers had event queues) sends each event to that endpoint's own
    # topic too: shown in the state, and `check --connect` warns.
    source, destination = quote(shipped_exchange, safe=""), quote(s.audit, safe="")
    api("POST", f"bindings/%2F/e/{source}/e/{destination}", {"routing_key": ""})
    shown = json.loads(bridge(s.config, "endpoints", "--json", "--connect").stdout)
    audit = next(e for e in shown["endpoints"] if e["name"] == s.audit)
    assert audit["subscriptions"][1]["state"] == (
        f"subscribed, also bound to {s.audit}: events arrive twice"
    )
    checked = bridge(s.config, "check", "--connect").stdout
    assert f"rabbit: warning: {s.audit} receives each {s.shipped} twice" in checked
    api("DELETE", f"bindings/%2F/e/{source}/e/{destination}/~")


async def test_restarts_duplicate_no_subscription_and_lose_no_event(site: Site) -> None:
    s = site
    bridge(s.config, "install")
    bound = {exchange: s.bindings(exchange) for exchange in s.exchanges[2:]}
    assert bound[s.exchanges[2]] == sorted(
        [
            ("exchange", "System:Object", ""),
            ("exchange", s.billing, ""),
            ("exchange", s.event_queues["rabbit"], ""),
        ]
    )
    placed = {f"p-{i}-{uuid.uuid4().hex[:6]}" for i in range(1000)}
    sink = s["pg"].sink(s.shipping)  # Sales published: one copy in the Shipping proxy
    await sink.send([event(i, s.placed) for i in sorted(placed)])
    await sink.close()
    to_kafka = {f"k-{i}-{uuid.uuid4().hex[:6]}" for i in range(1000)}
    sink = s["pg"].sink(s.event_queues["pg"])  # Sales published: one copy for Kafka
    await sink.send([event(i, s.placed) for i in sorted(to_kafka)])
    await sink.close()
    stock = {f"s-{i}-{uuid.uuid4().hex[:6]}" for i in range(1000)}
    producer = s["kafka"].sink(s.stock_topic)  # Inventory published on Kafka
    await producer.send([event(i, s.stock) for i in sorted(stock)])
    await producer.close()
    rows = s.rows()
    pg_route, kafka_route = f"proxy.pg.{s.shipping}", f"publish.pg.{s.stock_topic}"
    events_route = f"events.pg.{s.event_queues['pg']}"
    routes = ("--route", pg_route, "--route", kafka_route, "--route", events_route)
    with BridgeProcess(s.config, "run", *routes) as process:
        process.start()
        await s.wait_for_depth(s.shipping, 1, every=0.02)
        process.kill()  # kill -9 mid-stream
        moved = (await s["rabbit"].peek(s.shipping)).depth
        assert 0 < moved < len(placed), moved
        assert s.rows() == rows
        process.start()
        await s.wait_for_depth(s.shipping, len(placed), every=0.2)
        await s.wait_for_rows(s.billing, 1, every=0.02)  # the Kafka consumer joined its group
        process.kill()  # kill -9 mid-stream again, publishing from Kafka this time
        published = (await s["pg"].peek(s.billing)).depth
        assert 0 < published < len(stock), published
        process.start()
        await s.wait_for_rows(s.billing, len(stock), every=0.2)
        await s.wait_for_rows(s.event_queues["pg"], 0, every=0.2, drained=True)
        assert process.stop() == 0
    assert s.rows() == rows  # the restart subscribed again: the same rows, none doubled
    # and the same bindings; publishing StockChanged from Kafka chained it to System:Object.
    assert s.bindings(s.exchanges[2]) == bound[s.exchanges[2]]
    assert s.bindings(s.exchanges[3]) == sorted(
        {*bound[s.exchanges[3]], ("exchange", "System:Object", "")}
    )
    delivered = [m.message_id or "" for m in await drain(s["rabbit"], s.shipping)]
    report("pub/sub pg->rabbit, kill -9", placed, delivered, bound=50)
    published = [m.message_id or "" for m in await drain(s["pg"], s.billing)]
    report("pub/sub kafka->pg published, kill -9", stock, published, bound=50)
    # Through the event queue, killed with the others: each event on its topic, none lost.
    # (The kills are timed by the other routes: this one may be cut mid-batch or not.)
    on_topic = await s.read_topic(s.placed, (await s["kafka"].peek(s.placed)).depth)
    assert all(m.headers.get(INTENT) == "Publish" for m in on_topic)
    produced = [m.message_id or "" for m in on_topic]
    report("pub/sub pg->kafka event queue, kill -9", to_kafka, produced, bound=100)


async def test_no_subscription_names_a_missing_event_queue(
    tmp_path: Path,
    pg_dsn: str,
    pg_schema: str,
    rabbitmq_url: str,
    kafka_bootstrap: str,
    rabbitmq_queues: Callable[..., str],
) -> None:
    """Without `proxies: {create: true}` the event queues must exist: `bridge check --connect`
    names the missing ones, and `bridge install` makes no row or binding naming them (the
    publisher would lose the events: NServiceBus's SQL publisher fails on the missing table,
    RabbitMQ cannot bind to a missing exchange) and exits 1; once they exist, it subscribes."""
    sales, warehouse = rabbitmq_queues("Sales"), rabbitmq_queues("Warehouse")
    stats, poison = rabbitmq_queues("Stats"), rabbitmq_queues("poison")
    ns = unique("T")
    placed, shipped = f"{ns}.Sales.OrderPlaced", f"{ns}.W.Shipped{uuid.uuid4().hex[:8]}"
    config = tmp_path / "routes.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            connections:
              pg: {{type: postgresql, dsn: "{pg_dsn}", schema: "{pg_schema}"}}
              rabbit: {{type: rabbitmq, url: "{rabbitmq_url}", queue_type: quorum}}
              kafka: {{type: kafka, bootstrap_servers: "{kafka_bootstrap}"}}
            endpoints:
              {sales}: {{connection: pg}}
              {warehouse}: {{connection: rabbit}}
              {stats}:
                connection: kafka
                subscribes:
                  - {{event: {placed}, publisher: {sales}}}
                  - {{event: {shipped}, publisher: {warehouse}}}
            proxies: {{connections: [kafka], group: {unique("g")}, error_queue: {poison}}}
            """
        )
    )
    loaded = load_config(config).config
    queues = {s.connection: s.table for s in loaded.registry.pubsub.subscriptions() if s.table}
    pg = load("pg", loaded.connections["pg"])
    rabbit = load("rabbit", loaded.connections["rabbit"])
    kafka = load("kafka", loaded.connections["kafka"])
    try:
        await pg.install([sales, poison])
        await rabbit.install([warehouse, poison])
        await kafka.install([stats])
        checked = bridge(config, "check", "--connect", check=False)
        assert checked.returncode == 1
        assert f"{queues['pg']} is an event queue" in checked.stdout, checked.stdout
        assert f"{queues['rabbit']} is an event queue" in checked.stdout, checked.stdout
        installed = bridge(config, "install", check=False)
        assert installed.returncode == 1, installed.stdout
        assert "not subscribed" in installed.stderr and "event queue" in installed.stderr
        with psycopg.connect(pg_dsn) as db:
            rows = db.execute(f'SELECT count(*) FROM "{pg_schema}"."SubscriptionRouting"')
            assert rows.fetchone() == (0,)
        exchange = quote(f"{ns}.W:{shipped.rsplit('.', 1)[1]}", safe="")
        try:
            found = api("GET", f"exchanges/%2F/{exchange}/bindings/source")
        except urllib.error.HTTPError as exc:  # not even declared
            assert exc.code == 404
            found = []
        assert not [b for b in found if b["destination"] == queues["rabbit"]]
        # The event queues created as the endpoints' installers would: subscribed.
        await pg.install([queues["pg"]])
        await rabbit.install([queues["rabbit"]])
        installed = bridge(config, "install")
        assert f"subscribed {stats} to {shipped} at {queues['rabbit']}" in installed.stdout
        with psycopg.connect(pg_dsn) as db:
            rows = db.execute(
                f'SELECT endpoint, queueaddress FROM "{pg_schema}"."SubscriptionRouting"'
            )
            assert rows.fetchall() == [(stats, f'"{pg_schema}"."{queues["pg"]}"')]
    finally:
        for transport in (pg, rabbit, kafka):
            await transport.close()
        connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
        cleanup = connection.channel()
        cleanup.queue_delete(queues["rabbit"])
        for name in (queues["rabbit"], f"{ns}.W:{shipped.rsplit('.', 1)[1]}"):
            cleanup.exchange_delete(name)
        connection.close()
