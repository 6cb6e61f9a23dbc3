"""The sinks that publish events (`SqlPublisher`, `RabbitMQPublisher`), on real PostgreSQL and
RabbitMQ, without a bridge process: what each copy carries and where it goes.

NServiceBus facts pinned here, from their source:
- a publish sends one copy per subscriber address with `NServiceBus.MessageIntent = Publish`
  (Particular/NServiceBus.SqlServer@214c4e8f src/NServiceBus.Transport.Sql.Shared/Sending/
  MulticastToUnicastConverter.cs:14-26; NServiceBus's publish sets the intent before the
  transport sees the message);
- the subscribers are looked up by the topics of the event's types (PolymorphicSubscriptionStore
  .cs:17-57), which a record produced to an event's topic by a producer without NServiceBus
  does not name: the route's event type stands for them.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import psycopg
import pytest

from bridge.config.loader import load_config
from bridge.config.models import BridgeConfig
from bridge.envelope import Envelope, Headers
from bridge.service.subscriptions import publisher
from bridge.transports import load
from bridge.transports.sql.subscriptions import SubscriptionTable
from tests.conftest import unique
from tests.support.management import api

pytestmark = pytest.mark.integration

ENCLOSED = "NServiceBus.EnclosedMessageTypes"
INTENT = "NServiceBus.MessageIntent"


def config_of(tmp_path: Path, dsn: str, schema: str, url: str) -> BridgeConfig:
    path = tmp_path / "routes.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            connections:
              pg: {{type: postgresql, dsn: "{dsn}", schema: "{schema}"}}
              rabbit: {{type: rabbitmq, url: "{url}"}}
              kafka: {{type: kafka, bootstrap_servers: "127.0.0.1:1"}}
            endpoints:
              Inventory: {{connection: kafka}}
              Billing:
                connection: pg
                subscribes: [{{event: Inv.StockChanged, publisher: Inventory}}]
            """
        )
    )
    return load_config(path).config


async def received(transport: object, queue: str) -> list[Envelope]:
    source = transport.source(queue)  # type: ignore[attr-defined]
    try:
        batch = await source.receive_batch(10, 1.0)
        async with batch:
            await batch.commit()
            return list(batch.messages)
    finally:
        await source.close()


async def test_sql_publishes_a_record_that_names_no_type_as_its_routes_event(
    tmp_path: Path, pg_dsn: str, pg_schema: str, rabbitmq_url: str
) -> None:
    config = config_of(tmp_path, pg_dsn, pg_schema, rabbitmq_url)
    event = unique("Inv.StockChanged_")
    pg = load("pg", config.connections["pg"])
    await pg.install(["Billing"])
    table = SubscriptionTable(pg.dialect, "SubscriptionRouting")  # type: ignore[attr-defined]
    await table.create()
    await table.subscribe("Billing", f'"{pg_schema}"."Billing"', event)
    await table.close()
    sink = publisher(config, pg, "pg", event)
    # A record a Kafka producer without NServiceBus wrote to the event's topic, and one a
    # producer marked as a send: each copy is a publish.
    sent = Headers([("NServiceBus.MessageId", "k-0"), (INTENT, "Send"), (ENCLOSED, event)])
    await sink.send([Envelope(Headers([("NServiceBus.MessageId", "k-1")]), b"{}")])
    await sink.send([Envelope(sent, b"{}")])
    await sink.close()
    copy, other = await received(pg, "Billing")
    await pg.close()
    assert (copy.message_id, other.message_id) == ("k-1", "k-0")
    assert other.headers.get(INTENT) == "Publish"
    assert copy.headers.get(ENCLOSED) == event  # an NServiceBus subscriber knows what it got
    assert copy.headers.get(INTENT) == "Publish"


async def test_rabbitmq_publishes_a_record_that_names_no_type_to_its_routes_event(
    tmp_path: Path,
    pg_dsn: str,
    pg_schema: str,
    rabbitmq_url: str,
    rabbitmq_queues: Callable[..., str],
) -> None:
    config = config_of(tmp_path, pg_dsn, pg_schema, rabbitmq_url)
    queue = rabbitmq_queues("subscriber")
    event = f"{queue}.StockChanged"
    exchange = f"{queue}:StockChanged"
    rabbit = load("rabbit", config.connections["rabbit"])
    await rabbit.install([queue])
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    channel = connection.channel()
    channel.exchange_declare(exchange, "fanout", durable=True)
    channel.exchange_bind(queue, exchange, "")
    try:
        sink = publisher(config, rabbit, "rabbit", event)
        await sink.send([Envelope(Headers([("NServiceBus.MessageId", "k-2")]), b"{}")])
        await sink.close()
        [copy] = await received(rabbit, queue)
        assert copy.headers.get(ENCLOSED) == event
        assert copy.headers.get(INTENT) == "Publish"
    finally:
        channel.exchange_delete(exchange)
        connection.close()
        await rabbit.close()


async def test_sql_publishes_to_subscribers_in_other_schemas_of_the_database(
    tmp_path: Path, pg_dsn: str, pg_schema: str, rabbitmq_url: str
) -> None:
    """An address names its schema (`"schema"."table"`, PostgreSql/Addressing/QueueAddress.cs:
    17-42 of Particular/NServiceBus.SqlServer@214c4e8f); the transport sends to it there."""
    config = config_of(tmp_path, pg_dsn, pg_schema, rabbitmq_url)
    other = f"{pg_schema}_x"
    elsewhere = load("pg", config.connections["pg"].model_copy(update={"schema_": other}))
    with psycopg.connect(pg_dsn, autocommit=True) as db:
        db.execute(f'CREATE SCHEMA "{other}"')
    pg = load("pg", config.connections["pg"])
    try:
        await pg.install(["Billing", "Stock"])
        await elsewhere.install(["Audit"])
        table = SubscriptionTable(pg.dialect, "SubscriptionRouting")  # type: ignore[attr-defined]
        await table.create()
        await table.subscribe("Billing", f'"{pg_schema}"."Billing"', "Inv.StockChanged")
        await table.subscribe("Audit", f'"{other}"."Audit"', "Inv.StockChanged")
        await table.subscribe("Stock", "Stock", "System.Object")  # the connection's schema
        await table.close()
        sink = publisher(config, pg, "pg")
        headers = Headers([("NServiceBus.MessageId", "k-3"), (ENCLOSED, "Inv.StockChanged, Inv")])
        await sink.send([Envelope(headers, b"{}")])
        await sink.close()
        for transport, queue in ((pg, "Billing"), (elsewhere, "Audit"), (pg, "Stock")):
            [copy] = await received(transport, queue)
            assert copy.message_id == "k-3", queue
    finally:
        await pg.close()
        await elsewhere.close()
        with psycopg.connect(pg_dsn, autocommit=True) as db:
            db.execute(f'DROP SCHEMA "{other}" CASCADE')


async def test_rabbitmq_chains_the_enclosed_types_and_publishes_without_mandatory(
    tmp_path: Path,
    pg_dsn: str,
    pg_schema: str,
    rabbitmq_url: str,
    rabbitmq_queues: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Derived -> Base -> System:Object, as SetupTypeSubscriptions chains a class to its bases,
    and `mandatory=false` (Particular/NServiceBus.RabbitMQ@ec745bf8 src/NServiceBus.Transport.
    RabbitMQ/Routing/ConventionalRoutingTopology.cs:54-58, 93-110)."""
    config = config_of(tmp_path, pg_dsn, pg_schema, rabbitmq_url)
    ns = rabbitmq_queues("ns")
    derived, base = f"{ns}.Express", f"{ns}.Placed"
    mandatory: list[bool] = []
    publish = pika.channel.Channel.basic_publish

    def recorded(self: Any, *args: Any, **kwargs: Any) -> Any:
        mandatory.append(kwargs.get("mandatory", False))  # the bridge passes it by name
        return publish(self, *args, **kwargs)

    monkeypatch.setattr(pika.channel.Channel, "basic_publish", recorded)
    rabbit = load("rabbit", config.connections["rabbit"])
    sink = publisher(config, rabbit, "rabbit")
    headers = Headers([("NServiceBus.MessageId", "k-4"), (ENCLOSED, f"{derived}, E;{base}, E")])
    try:
        await sink.send([Envelope(headers, b"{}")])  # nobody subscribes: dropped, not returned
        assert mandatory == [False]
        assert bindings(f"{ns}:Express") == [("exchange", f"{ns}:Placed", "")]
        assert bindings(f"{ns}:Placed") == [("exchange", "System:Object", "")]
    finally:
        await sink.close()
        await rabbit.close()
        connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
        channel = connection.channel()
        for exchange in (f"{ns}:Express", f"{ns}:Placed"):
            channel.exchange_delete(exchange)
        connection.close()


def bindings(exchange: str) -> list[tuple[str, str, str]]:
    found = api("GET", f"exchanges/%2F/{quote(exchange, safe='')}/bindings/source")
    return sorted((b["destination_type"], b["destination"], b["routing_key"]) for b in found)
