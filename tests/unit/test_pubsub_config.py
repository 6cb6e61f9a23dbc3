"""`subscribes:` and `events:`: where the bridge subscribes on each subscriber's behalf, the
routes of events published on Kafka, and the rules `bridge check` enforces at FILE:LINE:COL.

Facts pinned here, from their source:
- The proxy subscribes with the subscriber's name and the proxy's own address: the Messaging
  Bridge creates each proxy as a raw endpoint named like the endpoint it stands for
  (Particular/NServiceBus.MessagingBridge@ef463cf src/NServiceBus.MessagingBridge/
  EndpointProxyFactory.cs:22-23) and subscribes it through its transport's subscription manager
  (SubscriptionManager.cs:46-49), which writes the endpoint's name and its local address
  (Particular/NServiceBus.SqlServer@214c4e8f src/NServiceBus.Transport.Sql.Shared/PubSub/
  SubscriptionManager.cs:9-11; SubscriptionTable.cs:27-40).
- The topic is the type's full name (TopicNames.cs:7); the exchange `Namespace:Name`
  (Particular/NServiceBus.RabbitMQ@ec745bf8 src/NServiceBus.Transport.RabbitMQ/Routing/
  ConventionalRoutingTopology.cs:19).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.commands import describe_registry, install, render_registry
from bridge.config.loader import parse_config
from bridge.config.models import BridgeConfig, EventRoute
from bridge.envelope import Headers
from bridge.errors import ConfigError
from bridge.migrate.spec import JobSpec
from bridge.nservicebus.events import (
    OBJECT,
    exchange_name,
    is_control,
    is_published,
    kafka_topic,
    topics_of,
    type_name_problem,
)
from bridge.transports.rabbitmq.events import publish_declarations
from bridge.transports.rabbitmq.events import subscribe as subscribe_declarations

CONNECTIONS = """\
connections:
  legacy: {type: sqlserver, dsn: "Driver=x", schema: dbo, catalog: nsb}
  pg:     {type: postgresql, dsn: "host=127.0.0.1", schema: shop}
  rabbit: {type: rabbitmq, url: "amqp://127.0.0.1/"}
  kafka:  {type: kafka, bootstrap_servers: "127.0.0.1:9092"}
"""

EVENT = "Sales.Messages.OrderPlaced"
PUBSUB = (
    CONNECTIONS
    + f"""\
endpoints:
  Sales:     {{connection: pg}}
  Inventory: {{connection: kafka}}
  Shipping:  {{connection: rabbit, subscribes: [{{event: {EVENT}, publisher: Sales}}]}}
  Analytics: {{connection: kafka, subscribes: [{{event: {EVENT}, publisher: Sales}}]}}
  Audit:     {{connection: kafka, subscribes: [{{event: {EVENT}, publisher: Sales}}]}}
  Billing:
    connection: legacy
    subscribes:
      - {{event: Inventory.StockChanged, publisher: Inventory}}
      - {{event: {EVENT}, publisher: Sales}}
  Stock:
    connection: pg
    subscribes: [{{event: Inventory.StockChanged, publisher: Inventory}}]
  Local:     {{connection: pg, subscribes: [{{event: {EVENT}, publisher: Sales}}]}}
events:
  Inventory.StockChanged: {{topic: inventory.stock-changed}}
"""
)


def config_of(text: str) -> BridgeConfig:
    return parse_config(text).config


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    return str(caught.value)


def test_each_subscription_is_made_where_its_publisher_lives() -> None:
    pubsub = config_of(PUBSUB).registry.pubsub
    made = {(s.endpoint, s.event): s for s in pubsub.subscriptions()}
    shipping = made["Shipping", EVENT]
    assert (shipping.kind, shipping.connection, shipping.queue) == ("proxy", "pg", "Shipping")
    assert shipping.address == '"shop"."Shipping"'  # the proxy's address, as NServiceBus writes
    billing = made["Billing", EVENT]
    assert (billing.kind, billing.address) == ("proxy", '"shop"."Billing"')
    assert made["Local", EVENT].kind == "local"  # on the publisher's own connection
    assert not made["Local", EVENT].native


def test_kafka_subscribers_share_one_address_so_an_event_goes_to_kafka_once() -> None:
    config = config_of(PUBSUB)
    pubsub = config.registry.pubsub
    made = {(s.endpoint, s.event): s for s in pubsub.subscriptions()}
    analytics, audit = made["Analytics", EVENT], made["Audit", EVENT]
    assert analytics.kind == audit.kind == "kafka"
    # Two rows (Endpoint differs), one QueueAddress: SELECT DISTINCT reads one subscriber. The
    # address is an event queue named from the Kafka connection and the event, no endpoint's.
    assert analytics.address == audit.address == '"shop"."kafka_OrderPlaced"'
    assert analytics.queue == audit.queue == analytics.table == "kafka_OrderPlaced"
    assert pubsub.event_topics() == {"kafka": ["Sales.Messages.OrderPlaced"]}
    routes = {r.name: r for r in config.derived_routes}
    route = routes["events.pg.kafka_OrderPlaced"]
    assert (route.from_.connection, route.from_.address) == ("pg", "kafka_OrderPlaced")
    assert (route.to.connection, route.to.address) == ("kafka", "Sales.Messages.OrderPlaced")
    assert (route.endpoint, getattr(route, "event", None)) == ("Analytics", EVENT)
    # The Kafka endpoints' proxies carry only what is sent to them.
    assert routes["proxy.pg.Analytics"].to.address == "Analytics"


AUDIT = f"  Audit:     {{connection: kafka, subscribes: [{{event: {EVENT}, publisher: Sales}}]}}\n"


def _kafka_first(text: str) -> str:
    """`text` with Audit, a Kafka subscriber, moved above Analytics."""
    audit = (
        f"  Audit:     {{connection: kafka, subscribes: [{{event: {EVENT}, publisher: Sales}}]}}\n"
    )
    assert audit in text
    moved = text.replace(audit, "")
    return moved.replace("  Analytics:", audit + "  Analytics:", 1)


@pytest.mark.parametrize("publisher", ["pg", "rabbit"])
def test_the_order_of_kafka_subscribers_changes_no_name_and_no_binding(publisher: str) -> None:
    """Adding a Kafka subscriber above another, or reordering them, leaves every event queue,
    address, binding and route where it was (the subscription is no endpoint's)."""
    text = PUBSUB.replace("Sales:     {connection: pg}", f"Sales:     {{connection: {publisher}}}")
    without = text.replace(AUDIT, "")
    seen = []
    for variant in (text, _kafka_first(text), without):
        config = config_of(variant)
        pubsub = config.registry.pubsub
        kafka = [s for s in pubsub.subscriptions() if s.kind == "kafka"]
        assert {s.endpoint for s in kafka} >= {"Analytics"}
        seen.append(
            (
                {(s.queue, s.address, s.table) for s in kafka},
                sorted(
                    (r.name, r.from_.address, r.to.address, r.endpoint)
                    for r in config.derived_routes
                    if r.name.startswith("events.")
                ),
            )
        )
    assert seen[0] == seen[1] == seen[2], seen
    [(queue, _, _)] = seen[0][0]
    assert queue == "kafka_OrderPlaced"


def test_an_event_queue_name_is_hashed_when_taken_and_fits_postgresql() -> None:
    """A queue already named like the event queue, or an event's short name another event
    shares, moves the event queue to a hashed name, within PostgreSQL's 55 bytes."""
    long_kafka = "k" * 80
    text = PUBSUB.replace("  kafka:  {", f"  {long_kafka}:  {{").replace(
        "connection: kafka", f"connection: {long_kafka}"
    )
    pubsub = config_of(text).registry.pubsub
    [queue] = {s.table for s in pubsub.subscriptions() if s.kind == "kafka"}
    assert queue is not None and len(queue.encode()) <= 55
    assert queue.startswith("k" * 10) and queue != f"{long_kafka}_OrderPlaced"
    taken = PUBSUB.replace(
        "  Local:     {connection: pg,",
        "  kafka_OrderPlaced: {connection: pg}\n  Local:     {connection: pg,",
    )
    [other] = {
        s.table for s in config_of(taken).registry.pubsub.subscriptions() if s.kind == "kafka"
    }
    assert other is not None and other != "kafka_OrderPlaced" and other.startswith("kafka_")


def test_an_event_published_on_kafka_is_read_once_per_subscribing_connection() -> None:
    config = config_of(PUBSUB)
    pubsub = config.registry.pubsub
    made = {(s.endpoint, s.event): s for s in pubsub.subscriptions()}
    billing = made["Billing", "Inventory.StockChanged"]
    # Subscribed on its own connection, as it would subscribe itself, so the publish finds it.
    assert (billing.kind, billing.connection, billing.address) == (
        "home",
        "legacy",
        "Billing@[dbo]@[nsb]",
    )
    routes = {r.name: r for r in config.derived_routes if isinstance(r, EventRoute)}
    assert set(routes) == {
        "publish.legacy.inventory.stock-changed",
        "publish.pg.inventory.stock-changed",
    }
    route = routes["publish.pg.inventory.stock-changed"]
    assert (route.from_.connection, route.from_.topic) == ("kafka", "inventory.stock-changed")
    assert route.from_.group == "bridge.publish.pg.inventory.stock-changed"
    assert (route.to.connection, route.event, route.endpoint) == (
        "pg",
        "Inventory.StockChanged",
        "Inventory",
    )


@pytest.mark.parametrize(
    ("change", "message", "where"),
    [
        (
            ("publisher: Sales}]}\n  Analytics", "publisher: Sails}]}\n  Analytics"),
            "publisher 'Sails' is not a registered endpoint (nearest: 'Sales'",
            "9:95",
        ),
        (
            ("publisher: Sales}]}\n  Audit", "publisher: Shipping}]}\n  Audit"),
            "has two publishers: 'Sales' (for 'Shipping') and 'Shipping'",
            "10:94",
        ),
        (
            (
                "[{event: Sales.Messages.OrderPlaced, publisher: Sales}]}\n  Audit",
                "[{event: 9x, publisher: Sales}]}\n  Audit",
            ),
            "event '9x' is not a .NET full type name",
            "10:55",
        ),
        (
            ("{topic: inventory.stock-changed}", "{topic: 'no spaces'}"),
            "event 'Inventory.StockChanged': Kafka topic name 'no spaces' is not valid",
            "22:35",
        ),
        (
            ("  Inventory.StockChanged: {", "  Inventory.Stock-Changed: {"),
            "event 'Inventory.Stock-Changed' is not a .NET full type name",
            "22:3",
        ),
    ],
)
def test_check_enforces_the_rules_of_events(
    change: tuple[str, str], message: str, where: str
) -> None:
    text = PUBSUB.replace(*change)
    assert text != PUBSUB
    error = error_of(text)
    assert message in error
    assert error.startswith(f"routes.yaml:{where}:"), error


def test_an_event_name_must_fit_subscription_routing() -> None:
    long = "A." + "B" * 260
    text = PUBSUB.replace(
        f"Analytics: {{connection: kafka, subscribes: [{{event: {EVENT}",
        f"Analytics: {{connection: kafka, subscribes: [{{event: {long}",
    )
    assert "SubscriptionRouting holds 200" in error_of(text)


def test_a_topic_the_bridge_reads_events_from_is_not_one_it_sends_events_to() -> None:
    text = PUBSUB.replace(
        "{topic: inventory.stock-changed}",
        "{topic: inventory.stock-changed}\n"
        "  Sales.Messages.OrderPlaced: {topic: inventory.stock-changed}",
    )
    assert "they would come back" in error_of(text)


def test_pub_sub_across_rabbitmq_needs_the_conventional_topology() -> None:
    text = PUBSUB.replace(
        'url: "amqp://127.0.0.1/"}', 'url: "amqp://127.0.0.1/", topology: direct}'
    )
    assert "whose topology is direct" in error_of(text)


def test_type_names_topics_and_exchanges() -> None:
    assert type_name_problem("Sales.Messages.OrderPlaced") is None
    assert type_name_problem("Sales.Outer+Inner") is None
    assert type_name_problem("Sales.Generic`1") is None
    assert type_name_problem("Sales..Bad") is not None
    assert type_name_problem("Sales.Order\n") is not None
    # C# identifiers are Unicode letters, digits and '_', not starting with a digit (C# spec,
    # lexical structure, identifiers); generic arity after a backtick, nested types after '+'.
    for name in ("Ventes.CommandePassée", "Склад.Отгружено", "営業.注文済み", "Sales._Ünder"):
        assert type_name_problem(name) is None, name
    assert type_name_problem("Sales.List`1+Node") is None
    for name in ("Sales.1st", "Sales.Order-Placed", "Sales.Order Placed", "Sales.€uro"):
        assert type_name_problem(name) is not None, name
    assert kafka_topic("Ventes.CommandePassée", {}) == "Ventes.CommandePass_e"
    assert exchange_name("Sales.Messages.OrderPlaced") == "Sales.Messages:OrderPlaced"
    assert exchange_name("Sales.Outer+Inner") == "Sales:Inner"
    assert exchange_name("System.Object") == "System:Object"
    assert kafka_topic("Sales.Outer+Inner`1", {}) == "Sales.Outer_Inner_1"
    assert kafka_topic(EVENT, {EVENT: "orders"}) == "orders"


def test_topics_are_the_enclosed_full_names_then_system_object() -> None:
    headers = Headers(
        [
            (
                "NServiceBus.EnclosedMessageTypes",
                "Sales.Express, Sales, Version=1.0.0.0;Sales.OrderPlaced, Sales, Version=1.0.0.0",
            ),
            ("NServiceBus.MessageIntent", "publish"),
        ]
    )
    assert topics_of(headers) == ["Sales.Express", "Sales.OrderPlaced", "System.Object"]
    assert is_published(headers) and not is_control(headers)
    assert is_control(Headers([("NServiceBus.MessageIntent", "Unsubscribe")]))


def test_endpoints_lists_each_subscription_and_how_it_is_made() -> None:
    shown = render_registry(describe_registry(config_of(PUBSUB)))
    assert (
        f'  subscribes to {EVENT} from Sales: its proxy "shop"."Shipping" on pg'
        in shown.splitlines()
    )
    assert (
        f'  subscribes to {EVENT} from Sales: event queue "shop"."kafka_OrderPlaced" on pg, '
        f"to topic {EVENT}, route events.pg.kafka_OrderPlaced" in shown.splitlines()
    )
    assert f"  subscribes to {EVENT} from Sales: on pg, by the endpoint itself" in shown


async def test_print_sql_prints_the_subscription_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "routes.yaml"
    config.write_text(PUBSUB)
    assert await install(str(config), print_only=True) == 0
    printed = capsys.readouterr().out
    assert (
        '-- subscriptions on pg: Shipping to Sales.Messages.OrderPlaced at "shop"."Shipping"'
        in (printed)
    )
    assert 'CREATE TABLE IF NOT EXISTS "shop"."SubscriptionRouting" (' in printed
    assert "MERGE" not in printed and "[nsb].[dbo].[SubscriptionRouting]" in printed
    # Billing subscribes at home to an event published on Kafka: on its own SQL Server.
    assert (
        "-- subscriptions on legacy: Billing to Inventory.StockChanged at Billing@[dbo]@[nsb]"
        in (printed)
    )


def test_a_publisher_without_types_chains_the_types_it_encloses() -> None:
    """As SetupTypeSubscriptions chains a class to its base, and that to its own
    (Particular/NServiceBus.RabbitMQ@ec745bf8 src/NServiceBus.Transport.RabbitMQ/Routing/
    ConventionalRoutingTopology.cs:93-110)."""
    declared = [d.text for d in publish_declarations(["Sales.Express", "Sales.Placed", OBJECT])]
    assert declared == [
        "exchange.declare exchange='Sales:Express' type=fanout durable=true",
        "exchange.declare exchange='Sales:Placed' type=fanout durable=true",
        "exchange.bind 'Sales:Placed' to 'Sales:Express' routing_key=''",
        "exchange.declare exchange='System:Object' type=fanout durable=true",
        "exchange.bind 'System:Object' to 'Sales:Placed' routing_key=''",
    ]


def test_a_subscription_binds_the_event_as_the_messaging_bridge_subscribes() -> None:
    """The Messaging Bridge subscribes with a run-time type whose base is System.Object
    (Particular/NServiceBus.MessagingBridge@ef463cf src/NServiceBus.MessagingBridge/
    RuntimeTypeGenerator.cs:57-81, SubscriptionManager.cs:37-49); the transport sets up the
    type's exchanges, then binds the subscriber (ConventionalRoutingTopology.cs:29-36)."""
    assert [d.text for d in subscribe_declarations("Sales.Placed", "Shipping")] == [
        "exchange.declare exchange='Sales:Placed' type=fanout durable=true",
        "exchange.declare exchange='System:Object' type=fanout durable=true",
        "exchange.bind 'System:Object' to 'Sales:Placed' routing_key=''",
        "exchange.bind 'Shipping' to 'Sales:Placed' routing_key=''",
    ]
    # IEvent is System.Object, which has no base (:32, :95).
    assert [d.text for d in subscribe_declarations("NServiceBus.IEvent", "Shipping")] == [
        "exchange.declare exchange='System:Object' type=fanout durable=true",
        "exchange.bind 'Shipping' to 'System:Object' routing_key=''",
    ]


async def test_print_sql_prints_rabbitmq_subscriptions_as_management_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "routes.yaml"
    config.write_text(
        PUBSUB.replace("Sales:     {connection: pg}", "Sales:     {connection: rabbit}")
    )
    assert await install(str(config), print_only=True) == 0
    printed = capsys.readouterr().out
    api = "http://127.0.0.1:15672/api/"
    assert (
        "-X PUT -H 'content-type: application/json' "
        '-d \'{"type":"fanout","durable":true,"auto_delete":false}\' '
        f"{api}exchanges/%2F/Sales.Messages%3AOrderPlaced\n"
    ) in printed
    # The Kafka subscribers' one binding, to their event queue's exchange, which is installed
    # with the proxies.
    binding = (
        "-X POST -H 'content-type: application/json' "
        '-d \'{"routing_key":"","arguments":{}}\' '
        f"{api}bindings/%2F/e/Sales.Messages%3AOrderPlaced/e/kafka_OrderPlaced\n"
    )
    assert binding in printed
    assert "/e/Audit" not in printed and "/e/Analytics\n" not in printed


WRITTEN = (
    CONNECTIONS
    + """\
routes:
  - name: legacy-stock
    from: {connection: kafka, topic: legacy.stock, group: g}
    to: {connection: pg}
    publish: true
"""
)


def test_a_written_route_publishes_on_a_connection_it_names_alone() -> None:
    (route,) = config_of(WRITTEN).all_routes
    assert route.publish and route.to.address == ""
    assert "names only its destination's connection" in error_of(
        WRITTEN.replace("to: {connection: pg}", "to: {connection: pg, queue: Stock}")
    )
    wrong = error_of(WRITTEN.replace("to: {connection: pg}", "to: {connection: kafka}"))
    assert wrong.startswith("routes.yaml:10:14: publish: connection 'kafka' is kafka")
    direct = WRITTEN.replace('url: "amqp://127.0.0.1/"}', 'url: "amqp://x/", topology: direct}')
    assert "has the direct topology" in error_of(
        direct.replace("{connection: pg}", "{connection: rabbit}")
    )


def test_migrate_refuses_a_route_that_publishes(tmp_path: Path) -> None:
    config = tmp_path / "routes.yaml"
    config.write_text(WRITTEN)
    with pytest.raises(ConfigError, match="publishes events, which `bridge migrate` does not"):
        JobSpec.from_file(str(config), "legacy-stock")


@pytest.mark.parametrize(
    ("events", "message", "where"),
    [
        # Sent to Shipping's proxy topic: Shipping would get every OrderPlaced as a message.
        (
            f"  {EVENT}: {{topic: Shipping}}\n",
            f"event {EVENT!r}: the bridge sends it to topic 'Shipping' on 'kafka', which is the "
            "proxy of endpoint 'Shipping'",
            "22:39",
        ),
        # Read from Inventory's own topic: what is sent to Inventory would be published.
        (
            "  Inventory.StockChanged: {topic: Inventory}\n",
            "event 'Inventory.StockChanged': the bridge publishes what it reads from topic "
            "'Inventory' on 'kafka', which is the input topic of endpoint 'Inventory'",
            "22:35",
        ),
    ],
)
def test_an_event_topic_is_no_endpoints_topic(events: str, message: str, where: str) -> None:
    text = PUBSUB.replace("  Inventory.StockChanged: {topic: inventory.stock-changed}\n", events)
    if "Inventory.StockChanged" not in events:
        text += "  Inventory.StockChanged: {topic: inventory.stock-changed}\n"
    error = error_of(text)
    assert message in error
    assert error.startswith(f"routes.yaml:{where}:"), error


def test_a_derived_event_topic_is_no_endpoints_topic() -> None:
    """An event named like an endpoint (a .NET type without a namespace) gets its topic."""
    text = PUBSUB.replace(
        f"Analytics: {{connection: kafka, subscribes: [{{event: {EVENT}",
        "Analytics: {connection: kafka, subscribes: [{event: Audit",
    )
    assert "sends it to topic 'Audit' on 'kafka', which is the input topic of endpoint" in (
        error_of(text)
    )


def test_a_kafka_subscriber_of_an_event_published_on_another_kafka_connection_is_refused() -> None:
    text = PUBSUB.replace(
        '  kafka:  {type: kafka, bootstrap_servers: "127.0.0.1:9092"}\n',
        '  kafka:  {type: kafka, bootstrap_servers: "127.0.0.1:9092"}\n'
        '  kafka2: {type: kafka, bootstrap_servers: "127.0.0.1:9093"}\n',
    ).replace(
        "Stock:\n    connection: pg",
        "Stock:\n    connection: kafka2",
    )
    error = error_of(text)
    assert (
        "endpoint 'Stock' on Kafka connection 'kafka2' subscribes to 'Inventory.StockChanged', "
        "which 'Inventory' publishes on Kafka connection 'kafka'"
    ) in error
    assert error.startswith("routes.yaml:20:18:"), error


async def test_unsubscribing_a_kafka_subscriber_keeps_the_binding_others_share() -> None:
    """Analytics and Audit receive OrderPlaced on Kafka through one binding, to their event
    queue's exchange: unsubscribing either by hand must not cut the other off."""
    from bridge.service.subscriptions import change

    config = config_of(
        PUBSUB.replace("Sales:     {connection: pg}", "Sales:     {connection: rabbit}")
    )
    for endpoint in ("Audit", "Analytics"):
        said = await change(config, endpoint, EVENT, subscribe=False)  # connects to nothing
        assert said.startswith(f"rabbit: kept the binding of {EVENT} to 'kafka_OrderPlaced': ")
        other = "Analytics" if endpoint == "Audit" else "Audit"
        assert f"{other} also receive(s) it" in said


def test_an_exchange_name_must_fit_rabbitmq() -> None:
    long = "Склад." + "Ж" * 150  # 156 characters; its exchange `Склад:ЖЖ...` 311 bytes
    text = PUBSUB.replace(
        f"Shipping:  {{connection: rabbit, subscribes: [{{event: {EVENT}",
        f"Shipping:  {{connection: rabbit, subscribes: [{{event: {long}",
    )
    assert "would be 311 bytes in UTF-8; RabbitMQ takes 255" in error_of(text)


NGINN = """\
connections:
  ng:     {type: sqlite, path: /tmp/ng.db, layout: nginn, nginn: {alias: ng, timezone: UTC}}
  rabbit: {type: rabbitmq, url: "amqp://127.0.0.1/"}
  kafka:  {type: kafka, bootstrap_servers: "127.0.0.1:9092"}
endpoints:
  Legacy:    {connection: ng}
  Warehouse: {connection: rabbit}
  Inventory: {connection: kafka}
"""


def test_pub_sub_across_nginn_tables_is_rows_of_nginns_subscription_table() -> None:
    """On NGinn tables a subscription is a row of NGinn's subscription table (publisher_endpoint,
    subscriber_endpoint, message_type: lafar6502/nginn-messagebus@1fa4baf NGinnBPM.MessageBus/
    create_subscribertable.sqlserver.sql; Impl/SqlSubscriptionService.cs:104-134), endpoints
    `sql://<alias>/<table>`, the type NGinn's name (`nginn.types`, before the comma)."""
    config = config_of(
        NGINN.replace(
            "timezone: UTC}",
            "timezone: UTC, types: {L.Placed: 'Lg.Placed, Lg', I.Stock: 'I.Stock, Inv'}}",
        )
        + "  Shipping: {connection: rabbit, subscribes: [{event: L.Placed, publisher: Legacy}]}\n"
        + "  Books: {connection: ng, subscribes: [{event: I.Stock, publisher: Inventory}]}\n"
        + "  Stats: {connection: kafka, subscribes: [{event: L.Placed, publisher: Legacy}]}\n"
    )
    pubsub = config.registry.pubsub
    rows = {(s.endpoint, s.kind): pubsub.nginn_row(s) for s in pubsub.subscriptions()}
    assert rows == {
        # An NGinn publisher: its own table's endpoint, the subscription's event table
        # subscribing (`event_tables.py`; test_nginn_event_tables.py).
        ("Shipping", "proxy"): ("sql://ng/Legacy", "sql://ng/Shipping_Placed", "Lg.Placed"),
        ("Stats", "kafka"): ("sql://ng/Legacy", "sql://ng/kafka_Placed", "Lg.Placed"),
        # A Kafka publisher's event, published on NGinn as the publisher's proxy there.
        ("Books", "home"): ("sql://ng/Inventory", "sql://ng/Books", "I.Stock"),
    }


def test_a_publish_route_onto_nginn_tables_names_the_publishers_table() -> None:
    routes = NGINN.split("endpoints:")[0] + (
        "routes:\n"
        "  - {name: p, from: {connection: kafka, topic: t, group: g}, to: {connection: ng}, "
        "publish: true}\n"
    )
    error = error_of(routes)
    assert error.startswith("routes.yaml:6:"), error
    assert "name the publisher's table as `to.queue`" in error
    config_of(routes.replace("to: {connection: ng}", "to: {connection: ng, queue: Legacy}"))
    long = "P" * 45  # sql://ng/PPP...: 54 characters, NGinn's from_endpoint holds 50
    error = error_of(
        routes.replace("to: {connection: ng}", f"to: {{connection: ng, queue: {long}}}")
    )
    assert "from_endpoint" in error and "its column holds 50" in error, error


def test_nginn_subscription_rows_must_fit_nginns_columns() -> None:
    long_type = "Lg." + "T" * 300 + ", Lg"
    text = (
        NGINN.replace("timezone: UTC}", f"timezone: UTC, types: {{L.Placed: '{long_type}'}}}}")
        + "  Shipping: {connection: rabbit, subscribes: [{event: L.Placed, publisher: Legacy}]}\n"
    )
    error = error_of(text)
    assert "NGinn message_type" in error and "its column holds 300" in error, error
    assert error.startswith("routes.yaml:9:"), error
    publisher = "I" * 45  # its endpoint on ng, from which the bridge publishes: 54 characters
    error = error_of(
        NGINN.replace("Inventory", publisher)
        + f"  Books: {{connection: ng, subscribes: [{{event: I.Stock, publisher: {publisher}}}]}}\n"
    )
    # Its proxy there, whose endpoint is also the from_endpoint of what the bridge publishes.
    assert f"proxy endpoint of {publisher!r} on 'ng'" in error and "holds 50" in error, error


async def test_unsubscribing_a_kafka_subscriber_keeps_the_nginn_row_others_share(
    tmp_path: Path,
) -> None:
    """NGinn's row is keyed by (publisher, message type, subscriber): every Kafka subscriber of
    the event shares its Kafka connection's event table, so unsubscribing one by hand must not
    cut the other off."""
    from bridge.service.subscriptions import change

    config = config_of(
        NGINN.replace("/tmp/ng.db", str(tmp_path / "ng.db"))
        + "  Stats: {connection: kafka, subscribes: [{event: L.Placed, publisher: Legacy}]}\n"
        + "  Audit: {connection: kafka, subscribes: [{event: L.Placed, publisher: Legacy}]}\n"
    )
    said = await change(config, "Audit", "L.Placed", subscribe=False)
    kept = "ng: kept the NGinn subscription of L.Placed to sql://ng/kafka_Placed: Stats also"
    assert said.startswith(kept), said


def test_an_nginn_subscriber_of_an_event_without_an_nginn_type_is_refused() -> None:
    """NGinn dispatches on the body's `$type` (nginn.md); NServiceBus bodies carry none, so an
    event the bridge writes onto NGinn tables needs a `nginn.types` entry, else the row mapping
    refuses every one at run time: published there from Kafka (`home`, the
    `publish.<conn>.<topic>` route) or forwarded by the subscriber's proxy (`proxy`)."""
    kafka = "  Books: {connection: ng, subscribes: [{event: I.Stock, publisher: Inventory}]}\n"
    error = error_of(NGINN + kafka)
    assert error.startswith("routes.yaml:9:48:"), error
    assert "'Books' on NGinn tables ('ng') subscribes to 'I.Stock'" in error, error
    assert "connections.ng.nginn.types" in error, error
    rabbit = "  Books: {connection: ng, subscribes: [{event: W.Moved, publisher: Warehouse}]}\n"
    error = error_of(NGINN + rabbit)
    assert error.startswith("routes.yaml:9:48:") and "'W.Moved'" in error, error
    mapped = "timezone: UTC, types: {I.Stock: 'Lg.Stock, Lg', W.Moved: 'Lg.Moved, Lg'}}"
    config_of(NGINN.replace("timezone: UTC}", mapped) + kafka)
    config_of(NGINN.replace("timezone: UTC}", mapped) + rabbit)
    # an NGinn publisher's rows carry NGinn's own $type: nothing to map
    other = "  ng2: {type: sqlite, path: /tmp/ng2.db, layout: nginn, nginn: {alias: ng2, "
    other += "timezone: UTC}}\n"
    text = NGINN.replace("endpoints:\n", other + "endpoints:\n") + (
        "  Old: {connection: ng2, subscribes: [{event: L.Placed, publisher: Legacy}]}\n"
    )
    config_of(text)


PUBLISHING_LOOP = """\
connections:
  pg:     {type: postgresql, dsn: "host=127.0.0.1", schema: shop}
  kafka:  {type: kafka, bootstrap_servers: "127.0.0.1:9092"}
endpoints:
  Sales: {connection: pg}
  Stats: {connection: kafka, subscribes: [{event: S.Placed, publisher: Sales}]}
routes:
  - name: loop
    from: {connection: kafka, topic: S.Placed, group: g1}
    to: {connection: pg}
    publish: true
"""


def test_a_written_publishing_route_reading_a_topic_the_bridge_fills_is_refused() -> None:
    """Stats (Kafka) subscribes to Sales' S.Placed: the event queue's route produces each event to
    topic `S.Placed`. A written route publishing what it reads there on pg again reaches
    Stats' subscription, and the event goes round for ever."""
    error = error_of(PUBLISHING_LOOP)
    assert error.startswith("routes.yaml:9:38:"), error  # from.topic
    assert "'loop'" in error and "come back" in error and "S.Placed" in error, error
    # Publishing on another connection, or reading another topic: no loop.
    config_of(PUBLISHING_LOOP.replace("topic: S.Placed", "topic: s.placed.in"))


def test_a_written_route_publishing_as_the_nginn_publisher_what_its_event_table_fills() -> None:
    """On NGinn tables: Stats' event table's route produces Legacy's L.Placed to topic
    `L.Placed`; a route publishing it on ng as Legacy reaches that event table again."""
    text = (
        NGINN
        + "  Stats: {connection: kafka, subscribes: [{event: L.Placed, publisher: Legacy}]}\n"
        + "routes:\n"
        + "  - name: back\n"
        + "    from: {connection: kafka, topic: L.Placed, group: g1}\n"
        + "    to: {connection: ng, queue: Legacy}\n"
        + "    publish: true\n"
    )
    error = error_of(text)
    assert "'back'" in error and "as sql://ng/Legacy" in error and "come back" in error, error
    assert error.startswith("routes.yaml:12:38:"), error
    # As another publisher, whose subscribers the event table is not: no loop.
    config_of(text.replace("queue: Legacy", "queue: Other"))


def test_a_subscriber_of_an_nginn_publisher_needs_no_proxy_there() -> None:
    """The events of an NGinn publisher come through event tables, whose routes need no proxy
    on the publisher's connection: `proxies: {connections: [rabbit, kafka]}` is enough."""
    config = config_of(
        NGINN
        + "  Shipping: {connection: rabbit, subscribes: [{event: L.Placed, publisher: Legacy}]}\n"
        + "  Stats: {connection: kafka, subscribes: [{event: L.Placed, publisher: Legacy}]}\n"
        + "proxies: {connections: [rabbit, kafka]}\n"
    )
    routes = {r.name for r in config.derived_routes}
    assert {"events.ng.Shipping_Placed", "events.ng.kafka_Placed"} <= routes, routes
    assert not [r for r in routes if r.startswith("proxy.ng.")], routes
    # A publisher with proxies of its own kind (RabbitMQ here) still needs the proxy.
    error = error_of(
        NGINN
        + "  Books: {connection: ng, subscribes: [{event: W.Shipped, publisher: Warehouse}]}\n"
        + "proxies: {connections: [ng, kafka]}\n"
    )
    assert "where it has no proxy" in error, error
