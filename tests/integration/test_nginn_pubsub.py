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
  NamedQueries.sqlserver.json:28-29);
- a Send writes a row just as Notify does (MessageBus.cs:374-398): `from_endpoint` the sender,
  no correlation id; the fluent API publishes with one (:652-656, 714-737).

The bridge subscribes an event table per subscription to the NGinn publisher
(`bridge/config/event_tables.py`), so that whatever lands there is that subscription's event.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from bridge.config.loader import load_config
from bridge.envelope import Envelope, Headers
from bridge.protocols import Transport
from bridge.service.api import route_report
from bridge.service.supervisor import Supervisor
from bridge.transports import load
from tests.conftest import unique
from tests.integration.test_registry import bridge
from tests.support.nginn import NGinn
from tests.support.queues import drain

pytestmark = pytest.mark.integration

INTENT = "NServiceBus.MessageIntent"
ENCLOSED = "NServiceBus.EnclosedMessageTypes"
CORRELATION = "NServiceBus.CorrelationId"
ZONE = "Europe/Warsaw"  # never UTC: a UTC created_date would be an hour or two off
SUBSCRIPTIONS = "NGinnMessageBus_Subscriptions"


class Site:
    """Legacy publishes on NGinn tables in PostgreSQL; Shipping (RabbitMQ), Billing (NServiceBus
    tables in PostgreSQL) and Analytics (Kafka) subscribe to its base event, Analytics to a second
    event of Legacy's too. Inventory publishes on Kafka; Books, on NGinn tables in SQLite,
    subscribes."""

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
        self.cancelled = f"{ns}.Legacy.OrderCancelled"
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
                    subscribes: [{{event: {self.placed}, publisher: {self.legacy}}},
                                 {{event: {self.cancelled}, publisher: {self.legacy}}}]
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
        pubsub = load_config(self.config).config.registry.pubsub
        #: (subscriber, event) -> its event table on ng
        self.tables = {(x.endpoint, x.event): x.table for x in pubsub.subscriptions() if x.table}

    def proxy(self, endpoint: str) -> NGinn:
        """`endpoint`'s proxy on ng, as an NGinn endpoint there sees it."""
        return NGinn("postgresql", f"{self.dsn}|{self.ng_schema}", endpoint, ZONE)

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
        """The records of `topic`, reading until `expect` came and 1 s more (10 s at most);
        read after the run, so every record the bridge produced is there already."""
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
                    quiet = time.monotonic() + 1
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


async def run(config: Path) -> list[dict[str, Any]]:
    """`bridge run --until-idle 4`, in this process: what `/routes` shows at its end."""
    supervisor = Supervisor(load_config(config).config, until_idle=4, poll_timeout=0.5)
    assert await supervisor.run() == 0
    return route_report(supervisor.runners)


async def test_nginn_tables_publish_and_subscribe_across_every_transport(site: Site) -> None:
    s = site
    placed_tables = {s.tables[sub, s.placed] for sub in (s.shipping, s.billing, s.analytics)}
    assert placed_tables == {
        f"{sub}_OrderPlaced" for sub in (s.shipping, s.billing, "kafka")
    }  # `<queue>_<event>`, Kafka's `<connection>_<event>`: they fit NGinn's 50 characters
    printed = bridge(s.config, "install", "--print-sql").stdout
    assert f'CREATE TABLE IF NOT EXISTS "{s.ng_schema}"."{SUBSCRIPTIONS}"' in printed
    for table in s.tables.values():  # the event tables, created as proxies are
        assert f'CREATE TABLE IF NOT EXISTS "{s.ng_schema}"."{table}"' in printed
    installed = bridge(s.config, "install").stdout
    shipping_table = s.tables[s.shipping, s.placed]
    assert f"ng: subscribed {s.shipping} to {s.placed} at sql://db/{shipping_table}" in installed

    # The rows NGinn would write when each event table subscribes from its own endpoint (one
    # per subscription; Analytics, on Kafka, through the Kafka subscribers' event table: an
    # event goes to Kafka once).
    rows = s.ng_rows()
    assert sorted(r[:3] for r in rows) == sorted(
        (f"sql://db/{s.legacy}", f"sql://db/{table}", event)
        for (_, event), table in s.tables.items()
    )
    assert len(rows) == 4
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

    # Legacy publishes a derived event as NGinn does: one row per subscriber endpoint, into
    # the event tables of the base event (Analytics subscribes to two events of Legacy's).
    body = json.dumps({"$type": f"{s.express}, Legacy", "OrderId": 7})
    chain = [s.express, s.placed, "System.Object"]
    targets = s.publisher.notify(body, chain, SUBSCRIPTIONS, ["u-1", "u-2", "u-3"])
    assert sorted(targets) == sorted(f"sql://db/{t}" for t in placed_tables)
    # The base event itself, published with a correlation id.
    body = json.dumps({"$type": f"{s.placed}, Legacy", "OrderId": 8})
    chain = [s.placed, "System.Object"]
    s.publisher.notify(body, chain, SUBSCRIPTIONS, ["c-1", "c-2", "c-3"], correlation_id="o-8")
    # Commands from Legacy to Shipping and Analytics, through their proxies, as NGinn sends.
    command = json.dumps({"$type": f"{s.legacy}.Recalculate, Legacy"})
    for endpoint, unique_id in ((s.shipping, "cmd-s"), (s.analytics, "cmd-a")):
        s.proxy(endpoint).send(command, unique_id=unique_id, from_endpoint=f"sql://db/{s.legacy}")
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

    report = await run(s.config)

    assert s.ng_rows() == rows and s.lite_rows() == [lite_row]  # `run` subscribed again
    derived = f"{s.express}, Legacy;{s.placed}"
    shipped = {m.message_id: m.headers for m in await drain(s["rabbit"], s.shipping)}
    billed = {m.message_id: m.headers for m in await drain(s["pg"], s.billing)}
    to_kafka = {m.message_id: m.headers for m in await s.read_topic(s.placed, 2)}
    for got in (shipped, billed, to_kafka):  # once each: published, the base listed
        events = {k: h for k, h in got.items() if not k.startswith("cmd-")}
        assert len(events) == 2, got
        kinds = sorted(
            (h.get(ENCLOSED), h.get(INTENT), h.get(CORRELATION)) for h in events.values()
        )
        assert kinds == sorted(
            [(derived, "Publish", None), (f"{s.placed}, Legacy", "Publish", "o-8")]
        ), kinds
    # The command reaches Shipping as it was sent; Analytics' on its own topic, not the event's.
    assert shipped["cmd-s"].get(INTENT) == "Send"
    assert shipped["cmd-s"].get(ENCLOSED) == f"{s.legacy}.Recalculate, Legacy"
    assert set(billed) | set(to_kafka) <= {"u-1", "u-2", "u-3", "c-1", "c-2", "c-3"}
    [to_analytics] = await s.read_topic(s.analytics, 1)
    assert (to_analytics.message_id, to_analytics.headers.get(INTENT)) == ("cmd-a", "Send")
    assert (await s["kafka"].peek(s.cancelled)).depth == 0
    # /routes counts the events each event table's route forwarded, by type; the proxies' none.
    routes = {r["name"]: r for r in report}
    for table in placed_tables:
        assert routes[f"events.ng.{table}"]["published"] == {s.express: 1, s.placed: 1}
    assert routes[f"proxy.ng.{s.shipping}"]["published"] == {}
    assert routes[f"proxy.ng.{s.shipping}"]["forwarded"] == 1

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
        (e["name"], x["event"]): (x["kind"], x["state"], x.get("route"))
        for e in shown["endpoints"]
        for x in e["subscriptions"]
    }
    route_of = {key: f"events.ng.{table}" for key, table in s.tables.items()}
    assert states == {
        (s.shipping, s.placed): ("proxy", "subscribed", route_of[s.shipping, s.placed]),
        (s.billing, s.placed): ("proxy", "subscribed", route_of[s.billing, s.placed]),
        (s.analytics, s.placed): ("kafka", "subscribed", route_of[s.analytics, s.placed]),
        (s.analytics, s.cancelled): ("kafka", "subscribed", route_of[s.analytics, s.cancelled]),
        (s.books, s.stock): ("home", "subscribed", None),
    }
    assert set(route_of.values()) <= {r["name"] for r in shown["routes"]}
    # By hand: unsubscribe Shipping and its row is gone, with the row of its proxy that a
    # bridge without event tables made; subscribe and the event table's is back.
    with psycopg.connect(s.dsn, autocommit=True) as db:
        db.execute(
            f'INSERT INTO "{s.ng_schema}"."{SUBSCRIPTIONS}" VALUES (%s, %s, %s, now(), NULL)',
            (f"sql://db/{s.legacy}", f"sql://db/{s.shipping}", s.placed),
        )
    bridge(s.config, "unsubscribe", "--endpoint", s.shipping, "--event", s.placed)
    assert len(s.ng_rows()) == 3
    bridge(s.config, "subscribe", "--endpoint", s.shipping, "--event", s.placed)
    assert sorted(r[:3] for r in s.ng_rows()) == sorted(r[:3] for r in rows)


# -- An event table that is not there, and the row an older bridge left -------------------------


@pytest.fixture
def ng_schema(pg_dsn: str) -> Iterator[str]:
    schema = unique("ng")
    with psycopg.connect(pg_dsn, autocommit=True) as db:
        db.execute(f'CREATE SCHEMA "{schema}"')
    yield schema
    with psycopg.connect(pg_dsn, autocommit=True) as db:
        db.execute(f'DROP SCHEMA "{schema}" CASCADE')


class Upgrade:
    """Legacy publishes on NGinn tables (ng), Billing (NServiceBus tables, pg) subscribes; the
    proxies are the endpoints' installers' (`proxies: {create: false}`): no event table."""

    def __init__(self, tmp_path: Path, dsn: str, ng: str, pg: str) -> None:
        self.dsn, self.ng = dsn, ng
        self.legacy, self.billing = unique("Legacy"), unique("Billing")
        self.stats, self.audit = unique("Stats"), unique("Audit")  # on Kafka
        self.event = f"{unique('T')}.Legacy.OrderPlaced"
        self.config = tmp_path / "routes.yaml"
        subscribes = f"subscribes: [{{event: {self.event}, publisher: {self.legacy}}}]"
        self.config.write_text(
            textwrap.dedent(
                f"""\
                connections:
                  ng: {{type: postgresql, dsn: "{dsn}", schema: "{ng}",
                        layout: nginn, nginn: {{alias: db, timezone: {ZONE}}}}}
                  pg: {{type: postgresql, dsn: "{dsn}", schema: "{pg}"}}
                  kafka: {{type: kafka, bootstrap_servers: "127.0.0.1:1"}}
                endpoints:
                  {self.legacy}: {{connection: ng}}
                  {self.billing}:
                    connection: pg
                    {subscribes}
                proxies: {{create: false, error_queue: poison, group: {unique("g")},
                           connections: [ng, pg]}}
                """
            )
        )
        self.kafka_endpoints = (
            f"  {self.stats}: {{connection: kafka, {subscribes}}}\n"
            f"  {self.audit}: {{connection: kafka, {subscribes}}}\n"
        )
        [made] = load_config(self.config).config.registry.pubsub.subscriptions()
        assert made.table is not None
        self.table = made.table
        self.publisher = NGinn("postgresql", f"{dsn}|{ng}", self.legacy, ZONE)

    async def install_queues(self) -> None:
        """What the endpoints' installers (and an older bridge's `install`) made: the queues
        and the proxies with their error queue; no event table."""
        connections = load_config(self.config).config.connections
        ng, pg = load("ng", connections["ng"]), load("pg", connections["pg"])
        try:
            await ng.install([self.legacy, self.billing, "poison"])
            await pg.install([self.billing, self.legacy, "poison"])
        finally:
            await ng.close()
            await pg.close()

    def create_proxies(self) -> None:
        self.config.write_text(self.config.read_text().replace("create: false", "create: true"))

    def rows(self) -> list[tuple[str, str, str]]:
        with psycopg.connect(self.dsn) as db:
            found = db.execute(
                "SELECT to_regclass(%s)", (f'"{self.ng}"."{SUBSCRIPTIONS}"',)
            ).fetchone()
            if found is None or found[0] is None:
                return []
            return sorted(
                (str(p), str(s), str(m))
                for p, s, m in db.execute(
                    "SELECT publisher_endpoint, subscriber_endpoint, message_type "
                    f'FROM "{self.ng}"."{SUBSCRIPTIONS}"'
                )
            )

    def publish(self, *unique_ids: str) -> list[str]:
        """Legacy publishes the event as NGinn does (its Notify, in its own transaction)."""
        body = json.dumps({"$type": f"{self.event}, Legacy", "OrderId": 1})
        return self.publisher.notify(body, [self.event, "System.Object"], SUBSCRIPTIONS, unique_ids)


@pytest.fixture
async def upgrade(tmp_path: Path, pg_dsn: str, pg_schema: str, ng_schema: str) -> Upgrade:
    u = Upgrade(tmp_path, pg_dsn, ng_schema, pg_schema)
    await u.install_queues()
    return u


async def test_no_subscription_row_names_an_event_table_that_does_not_exist(
    upgrade: Upgrade,
) -> None:
    """Without its event table, `bridge install` and `bridge run` write no row naming it (NGinn's
    Notify would insert into a missing table in the publisher's transaction, and fail); install
    exits 1 saying how to create it, run says the subscription is not ready. Once the table is
    there, the row is written and the events arrive."""
    u = upgrade
    installed = bridge(u.config, "install", check=False)
    assert installed.returncode == 1, installed
    assert "proxies: {create: true}" in installed.stderr and u.table in installed.stderr
    assert f"sql://db/{u.table}" not in {row[1] for row in u.rows()}

    ran = bridge(u.config, "run", "--until-idle", "3", check=False)
    assert f"not subscribed {u.billing} to {u.event}: event table {u.table!r}" in ran.stderr
    assert f"route events.ng.{u.table} is not ready" in ran.stderr
    assert u.rows() == []
    assert u.publish("u-1") == []  # NGinn's publisher still publishes (to nobody yet)

    u.create_proxies()
    bridge(u.config, "install")  # the event table, then its row
    assert u.rows() == [(f"sql://db/{u.legacy}", f"sql://db/{u.table}", u.event)]
    assert u.publish("u-2") == [f"sql://db/{u.table}"]
    bridge(u.config, "run", "--until-idle", "3")
    pg = load("pg", load_config(u.config).config.connections["pg"])
    try:
        got = await drain(pg, u.billing)
    finally:
        await pg.close()
    assert [(m.message_id, m.headers.get(INTENT)) for m in got] == [("u-2", "Publish")]


async def test_run_subscribes_once_the_event_table_exists(upgrade: Upgrade) -> None:
    """`bridge run` keeps trying: the row is written once someone creates the event table."""
    u = upgrade
    supervisor = Supervisor(load_config(u.config).config, until_idle=None, poll_timeout=0.2)
    running = asyncio.create_task(supervisor.run())
    try:
        await asyncio.sleep(1.5)
        assert u.rows() == []
        ng = load("ng", load_config(u.config).config.connections["ng"])
        try:
            await ng.install([u.table])
        finally:
            await ng.close()
        for _ in range(50):  # the retry after a 1 s, then 2 s, then 4 s backoff
            if u.rows():
                break
            await asyncio.sleep(0.2)
        assert u.rows() == [(f"sql://db/{u.legacy}", f"sql://db/{u.table}", u.event)]
    finally:
        supervisor.stop()
        await running


async def test_an_older_bridges_row_for_the_proxy_is_shown_warned_and_removed(
    upgrade: Upgrade,
) -> None:
    """A bridge from before event tables subscribed Billing's proxy itself; the upgrade adds the
    event table's row. Each event then arrives twice (once as a message through the proxy):
    `bridge endpoints --connect` says so, `bridge check --connect` warns, and `bridge
    unsubscribe` then `bridge subscribe` leave the event table's row alone."""
    u = upgrade
    proxy = f"sql://db/{u.billing}"
    with psycopg.connect(u.dsn, autocommit=True) as db:  # the older bridge's row
        db.execute(
            f'CREATE TABLE "{u.ng}"."{SUBSCRIPTIONS}" (publisher_endpoint varchar(200), '
            "subscriber_endpoint varchar(200), message_type varchar(300), created_date "
            "timestamp, expiration_date timestamp NULL)"
        )
        db.execute(
            f'INSERT INTO "{u.ng}"."{SUBSCRIPTIONS}" VALUES (%s, %s, %s, now(), NULL)',
            (f"sql://db/{u.legacy}", proxy, u.event),
        )
    shown = bridge(u.config, "endpoints", "--connect").stdout
    assert f"missing; at {proxy} instead: events arrive as messages" in shown, shown
    u.create_proxies()
    bridge(u.config, "install")

    shown = bridge(u.config, "endpoints", "--connect").stdout
    assert f"subscribed, also at {proxy}: events arrive twice" in shown, shown
    checked = bridge(u.config, "check", "--connect").stdout
    assert f"ng: warning: {u.billing} receives each {u.event} twice" in checked, checked
    assert sorted(u.publish("u-1", "u-2")) == sorted([proxy, f"sql://db/{u.table}"])
    bridge(u.config, "run", "--until-idle", "3")
    pg = load("pg", load_config(u.config).config.connections["pg"])
    try:
        intents = sorted(m.headers.get(INTENT) or "" for m in await drain(pg, u.billing))
    finally:
        await pg.close()
    assert intents == ["Publish", "Send"]  # the double delivery the warning is about

    bridge(u.config, "unsubscribe", "--endpoint", u.billing, "--event", u.event)
    bridge(u.config, "subscribe", "--endpoint", u.billing, "--event", u.event)
    assert u.rows() == [(f"sql://db/{u.legacy}", f"sql://db/{u.table}", u.event)]
    shown = bridge(u.config, "endpoints", "--connect").stdout
    assert "twice" not in shown and "subscribed" in shown
    assert "twice" not in bridge(u.config, "check", "--connect").stdout


async def test_unsubscribing_one_kafka_subscriber_removes_the_carriers_older_row(
    upgrade: Upgrade,
) -> None:
    """Two Kafka subscribers share one event table and its row; a bridge from before event
    tables subscribed the carrier's proxy. `bridge unsubscribe` of one keeps the shared row
    (the other still reads the topic) and removes the carrier's older one."""
    u = upgrade
    text = u.config.read_text()
    text = text.replace("proxies:", u.kafka_endpoints + "proxies:")
    u.config.write_text(text.replace("connections: [ng, pg]", "connections: [ng, pg, kafka]"))
    pubsub = load_config(u.config).config.registry.pubsub
    shared = {s.address for s in pubsub.subscriptions() if s.endpoint in (u.stats, u.audit)}
    [address] = shared
    carrier = next(s.queue for s in pubsub.subscriptions() if s.endpoint == u.stats)
    ng = load("ng", load_config(u.config).config.connections["ng"])
    try:
        await ng.install([address.rsplit("/", 1)[1], u.table])  # the event tables
    finally:
        await ng.close()
    bridge(u.config, "subscribe", "--endpoint", u.stats, "--event", u.event)
    with psycopg.connect(u.dsn, autocommit=True) as db:  # the older bridge's row
        db.execute(
            f'INSERT INTO "{u.ng}"."{SUBSCRIPTIONS}" VALUES (%s, %s, %s, now(), NULL)',
            (f"sql://db/{u.legacy}", f"sql://db/{carrier}", u.event),
        )

    said = bridge(u.config, "unsubscribe", "--endpoint", u.stats, "--event", u.event).stdout
    assert f"removed the row of sql://db/{carrier}" in said, said
    assert u.rows() == [(f"sql://db/{u.legacy}", address, u.event)]
