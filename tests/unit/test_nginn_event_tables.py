"""NGinn event tables: the table the bridge subscribes per subscription to an NGinn publisher,
the route that reads it, and `bridge check`'s refusals.

NGinn's Notify writes a row as its Send does (Impl/MessageBus.cs:347-371 vs 374-398 of
lafar6502/nginn-messagebus @1fa4baf), so a row in a proxy says nothing of being an event; a
table only Notify writes to does. NGinn pastes a table name into its SQL unquoted
(NamedQueries.sqlserver.json:8, CommonQueueOps.cs:132), and `to_endpoint` holds 50 characters
(createmqueue.sqlserver.sql).
"""

from __future__ import annotations

from bridge.commands.inspect import describe_registry, render_registry
from bridge.config.event_tables import HASH_CHARS, event_table, event_tables
from bridge.config.models import DerivedRoute, EventTableRoute
from bridge.envelope import Envelope, Headers
from bridge.transports.memory import Broker
from bridge.transports.memory import Transport as MemoryTransport
from tests.conftest import unique
from tests.unit.test_pubsub_config import NGINN, config_of, error_of
from tests.unit.test_runner import run_until, runner_for

PLACED = "  Shipping: {connection: rabbit, subscribes: [{event: L.Placed, publisher: Legacy}]}\n"


def subscribes(name: str, connection: str, *events: str) -> str:
    listed = ", ".join(f"{{event: {e}, publisher: Legacy}}" for e in events)
    return f"  {name}: {{connection: {connection}, subscribes: [{listed}]}}\n"


# -- names -------------------------------------------------------------------------------------


def test_an_event_table_is_the_queue_and_the_events_name() -> None:
    assert event_table("Shipping", "Sales.Messages.OrderPlaced", 41, set()) == (
        "Shipping_OrderPlaced"
    )
    # Only what NGinn's unquoted SQL takes: no `.`, `-`, `+` or letters outside ASCII.
    assert event_table("Sales.Api-2", "Ns.Outer+Inner", 41, set()) == "Sales_Api_2_Outer_Inner"
    assert event_table("Ventes", "Ventes.CommandePassée", 41, set()) == "Ventes_CommandePass_e"
    assert event_table("2Fast", "N.E", 41, set()) == "_2Fast_E"


def test_a_name_too_long_for_nginns_endpoint_falls_back_to_a_stable_hash() -> None:
    queue = "OrderFulfillmentCoordinatorOfTheWarehouse"
    event = "Sales.Messages.ExpressOrderPlacedWithPriority"
    name = event_table(queue, event, 41, set())
    assert name is not None and len(name) == 41  # the queue's name cut to fit
    stem, _, digest = name.rpartition("_")
    assert queue.startswith(stem) and len(digest) == HASH_CHARS
    assert all(c in "0123456789abcdef" for c in digest)
    assert event_table(queue, event, 41, set()) == name  # stable
    assert event_table(queue, "Sales.Messages.Other" + "X" * 30, 41, set()) != name
    # The least room a name takes: a bare hash.
    bare = event_table(queue, event, HASH_CHARS + 1, set())
    assert bare is not None and bare.startswith("_") and len(bare) == HASH_CHARS + 1
    assert event_table(queue, event, HASH_CHARS, set()) is None


def test_a_taken_name_falls_back_to_a_hash_and_a_taken_hash_to_another() -> None:
    plain = event_table("Shipping", "A.Placed", 41, set())
    assert plain == "Shipping_Placed"
    hashed = event_table("Shipping", "A.Placed", 41, {"shipping_placed"})
    assert hashed is not None and hashed.startswith("Shipping_") and hashed != plain
    again = event_table("Shipping", "A.Placed", 41, {"shipping_placed", hashed.casefold()})
    assert again not in (None, plain, hashed)


def test_each_subscription_to_an_nginn_publisher_gets_its_own_table() -> None:
    """Two events of one short name, an endpoint named like a table: none shares a table."""
    config = config_of(
        NGINN
        + subscribes("Shipping", "rabbit", "L.Placed", "Other.Placed")
        + "  Shipping_Gone: {connection: rabbit}\n"
        + subscribes("Shipping", "rabbit", "L.Gone").replace("Shipping", "Returns")
        + subscribes("Stats", "kafka", "L.Placed")
        + subscribes("Audit", "kafka", "L.Placed")
    )
    made = {(s.endpoint, s.event): s for s in config.registry.pubsub.subscriptions()}
    # One short name, two events: both hashed, neither first.
    placed, other = made["Shipping", "L.Placed"].table, made["Shipping", "Other.Placed"].table
    assert placed is not None and other is not None and placed != other
    assert placed.startswith("Shipping_") and other.startswith("Shipping_")
    assert "Shipping_Placed" not in (placed, other)
    assert made["Returns", "L.Gone"].table == "Returns_Gone"
    assert made["Shipping", "L.Placed"].address == f"sql://ng/{placed}"
    # The Kafka subscribers share their Kafka connection's table: the event goes there once.
    assert made["Stats", "L.Placed"].table == made["Audit", "L.Placed"].table == "kafka_Placed"
    tables = [s.table for s in made.values() if s.table]
    assert len(set(tables)) == len(tables) - 1  # Stats and Audit share one


def tables(text: str) -> dict[tuple[str, str], str | None]:
    return {(s.endpoint, s.event): s.table for s in config_of(text).registry.pubsub.subscriptions()}


def shipping(*entries: tuple[str, str]) -> str:
    listed = "\n".join(f"      - {{event: {e}, publisher: {p}}}" for e, p in entries)
    return f"  Shipping:\n    connection: rabbit\n    subscribes:\n{listed}\n"


def test_the_order_of_the_file_names_no_event_table() -> None:
    """Two events of one short name from two NGinn publishers: swapping the entries keeps each
    its table. (The bridge never unsubscribes on its own: a renamed table would leave the old
    row filling a table that its route now reads as the other event.)"""
    two = NGINN + "  Legacy2:   {connection: ng}\n"
    before = tables(two + shipping(("A.Placed", "Legacy"), ("B.Placed", "Legacy2")))
    after = tables(two + shipping(("B.Placed", "Legacy2"), ("A.Placed", "Legacy")))
    assert before == after
    assert len(set(before.values())) == 2


def test_a_kafka_subscriber_added_above_another_keeps_the_event_table() -> None:
    """The Kafka subscribers' table is their Kafka connection's, not the carrier's (the first
    of them in the file): adding one above renames nothing, so NGinn's row stays the one read."""
    stats = "  Stats: {connection: kafka, subscribes: [{event: L.Placed, publisher: Legacy}]}\n"
    audit = stats.replace("Stats", "Audit")
    before = tables(NGINN + stats)
    after = tables(NGINN + audit + stats)
    assert before["Stats", "L.Placed"] == after["Stats", "L.Placed"] == "kafka_Placed"
    assert after["Audit", "L.Placed"] == "kafka_Placed"


def test_a_kafka_connection_named_like_a_queue_gets_a_table_of_its_own() -> None:
    """The Kafka subscribers' owner is hashed apart from a queue of the same name."""
    wanted = [("kafka", "kafka:kafka", "L.Placed"), ("kafka", "kafka", "L.Placed")]
    named = event_tables(wanted, 41, set())
    assert len(set(named.values())) == 2
    assert event_tables(list(reversed(wanted)), 41, set()) == named


def test_an_endpoints_own_queue_is_never_an_event_table() -> None:
    config = config_of(NGINN + PLACED + "  Shipping_Placed: {connection: ng}\n")
    [s] = [s for s in config.registry.pubsub.subscriptions() if s.endpoint == "Shipping"]
    assert s.table is not None and s.table.casefold() != "shipping_placed"


# -- routes ------------------------------------------------------------------------------------


def test_one_route_per_event_table_into_the_subscribers_queue_or_the_events_topic() -> None:
    config = config_of(
        NGINN
        + PLACED
        + subscribes("Stats", "kafka", "L.Placed")
        + subscribes("Audit", "kafka", "L.Placed")
    )
    routes = {r.name: r for r in config.derived_routes if isinstance(r, EventTableRoute)}
    assert set(routes) == {"events.ng.Shipping_Placed", "events.ng.kafka_Placed"}
    shipping = routes["events.ng.Shipping_Placed"]
    assert (shipping.from_.connection, shipping.from_.queue) == ("ng", "Shipping_Placed")
    assert (shipping.to.connection, shipping.to.queue) == ("rabbit", "Shipping")
    assert (shipping.endpoint, shipping.event) == ("Shipping", "L.Placed")
    kafka = routes["events.ng.kafka_Placed"]  # once, whatever the number of Kafka subscribers
    assert (kafka.to.connection, kafka.to.topic) == ("kafka", "L.Placed")
    # The proxies' own routes stay: commands and replies to Shipping and Stats.
    names = {r.name for r in config.derived_routes}
    assert {"proxy.ng.Shipping", "proxy.ng.Stats"} <= names
    shown = describe_registry(config)
    shipping = next(e for e in shown["endpoints"] if e["name"] == "Shipping")
    [subscription] = shipping["subscriptions"]
    assert subscription["table"] == "Shipping_Placed"
    assert subscription["route"] == "events.ng.Shipping_Placed"
    text = render_registry(shown)
    assert "event table sql://ng/Shipping_Placed on ng, route events.ng.Shipping_Placed" in text
    assert "ng      sql://ng/Shipping  (proxy, route proxy.ng.Shipping)" in text


def test_publishers_elsewhere_keep_their_proxies() -> None:
    """A publisher on RabbitMQ (or NServiceBus tables): the proxy subscribes, as before, also
    an NGinn subscriber's proxy; no event table. A Kafka subscriber's is an event queue there,
    named as NGinn's event tables are, with a route of its own to the event's topic."""
    typed = NGINN.replace("timezone: UTC}", "timezone: UTC, types: {S.Placed: 'S.Placed, S'}}")
    config = config_of(
        typed
        + "  Sales: {connection: rabbit}\n"
        + "  Books: {connection: ng, subscribes: [{event: S.Placed, publisher: Sales}]}\n"
        + "  Stats: {connection: kafka, subscribes: [{event: S.Placed, publisher: Sales}]}\n"
    )
    made = {s.endpoint: s for s in config.registry.pubsub.subscriptions()}
    assert (made["Books"].kind, made["Books"].queue, made["Books"].table) == (
        "proxy",
        "Books",
        None,
    )
    stats = made["Stats"]
    assert (stats.kind, stats.queue, stats.table) == ("kafka", "kafka_Placed", "kafka_Placed")
    [route] = [r for r in config.derived_routes if isinstance(r, EventTableRoute)]
    assert route.name == "events.rabbit.kafka_Placed"
    assert (route.from_.connection, route.from_.queue) == ("rabbit", "kafka_Placed")
    assert (route.to.connection, route.to.topic, route.event) == ("kafka", "S.Placed", "S.Placed")


def row(message_id: str, enclosed: str, **more: str) -> Envelope:
    """A row of Legacy's as the NGinn mapping reads it (`nginn_incoming`): intent Send."""
    headers = Headers(
        [
            ("NServiceBus.MessageId", message_id),
            ("NServiceBus.OriginatingEndpoint", "sql://db/Legacy"),
            ("NServiceBus.EnclosedMessageTypes", enclosed),
            ("NServiceBus.MessageIntent", "Send"),
        ]
    )
    for name, value in more.items():
        headers.add(name, value)
    return Envelope(headers, b"{}")


async def test_an_event_tables_route_marks_every_row_published_and_counts_it() -> None:
    """Every row of an event table is an event of its subscription: its own type, a derived
    class (listed first, the subscribed event after, as NServiceBus lists base types), one with a
    correlation id (`NewMessage(e).SetCorrelationId(id).Publish()`, MessageBus.cs:652-656,
    714-737). The runner counts them as published, by type."""
    transport = MemoryTransport(broker=Broker())
    route = EventTableRoute.model_validate(
        {
            "name": "events.ng.Shipping_Placed",
            "endpoint": "Shipping",
            "event": "L.Placed",
            "from": {"connection": "a", "queue": unique("Shipping_Placed")},
            "to": {"connection": "b", "queue": unique("Shipping")},
        }
    )
    await transport.sink(route.from_.address).send(
        [
            row("e-1", "L.Placed, L"),
            row("e-2", "L.ExpressPlaced, L"),
            row("e-3", "L.Placed, L", **{"NServiceBus.CorrelationId": "order-42"}),
        ]
    )
    runner = runner_for(route, transport)
    destination = transport.broker.queue(route.to.address)
    await run_until(runner, lambda: len(destination) == 3)
    got = {e.message_id: e.headers for e in destination}
    assert {m: h.get("NServiceBus.MessageIntent") for m, h in got.items()} == dict.fromkeys(
        ("e-1", "e-2", "e-3"), "Publish"
    )
    assert got["e-1"].get("NServiceBus.EnclosedMessageTypes") == "L.Placed, L"
    assert got["e-2"].get("NServiceBus.EnclosedMessageTypes") == "L.ExpressPlaced, L;L.Placed"
    assert got["e-3"].get("NServiceBus.CorrelationId") == "order-42"
    assert runner.stats.published == {"L.Placed": 2, "L.ExpressPlaced": 1}


async def test_a_command_through_the_proxy_stays_a_command() -> None:
    """Legacy sends Shipping a command through its proxy: the proxy's route forwards it as it
    came, whatever Shipping subscribes to from Legacy."""
    transport = MemoryTransport(broker=Broker())
    route = DerivedRoute.model_validate(
        {
            "name": "proxy.ng.Shipping",
            "endpoint": "Shipping",
            "from": {"connection": "a", "queue": unique("proxy")},
            "to": {"connection": "b", "queue": unique("Shipping")},
        }
    )
    await transport.sink(route.from_.address).send([row("cmd-1", "L.Recalculate, L")])
    runner = runner_for(route, transport)
    destination = transport.broker.queue(route.to.address)
    await run_until(runner, lambda: len(destination) == 1)
    [forwarded] = list(destination)
    assert forwarded.headers.get("NServiceBus.MessageIntent") == "Send"
    assert forwarded.headers.get("NServiceBus.EnclosedMessageTypes") == "L.Recalculate, L"
    assert runner.stats.published == {}


# -- bridge check ------------------------------------------------------------------------------


def test_an_alias_that_leaves_no_room_for_an_event_table_is_refused() -> None:
    alias = "a" * 33  # sql://<alias>/ is 41 characters: 9 left, a table needs 11
    short = NGINN.replace("alias: ng", f"alias: {alias}").replace("Warehouse", "W")
    short = short.replace("Inventory", "I").replace("Legacy", "L")
    s = "  S: {connection: rabbit, subscribes: [{event: L.Placed, publisher: L}]}\n"
    error = error_of(short + s)
    assert error.startswith("routes.yaml:9:"), error
    assert "event table" in error and "shorten `nginn.alias` of 'ng'" in error, error
    config_of(short.replace(alias, alias[:-2]) + s)  # 11 left: a bare hash


def test_an_endpoint_whose_proxy_on_nginn_tables_is_too_long_is_refused() -> None:
    """A 45-character endpoint: its proxy on ng, `sql://ng/SSS...`, is 54 characters, more than
    `to_endpoint` holds; its proxy route could not read it, nor NGinn send to it."""
    long = "S" * 45
    error = error_of(NGINN + PLACED.replace("Shipping", long))
    assert error.startswith("routes.yaml:9:3:"), error
    assert f"proxy endpoint of {long!r} on 'ng'" in error and "holds 50" in error, error
    # Its event table fits, hashed.
    config = config_of(NGINN + PLACED.replace("Shipping", "S" * 41))
    [s] = [s for s in config.registry.pubsub.subscriptions() if s.endpoint == "S" * 41]
    assert s.table is not None and len(s.address) <= 50 and s.table != f"{'S' * 41}_Placed"


def test_check_says_a_missing_event_table_is_one() -> None:
    """`bridge check --connect` without `proxies: {create: true}`: what is missing and why."""
    from bridge.commands.setup import _made_like_proxies

    tables = {"Shipping_Placed": "NGinn event table", "kafka_Placed": "event queue"}
    assert _made_like_proxies(["Shipping_Placed"], tables) == "is an NGinn event table"
    assert _made_like_proxies(["kafka_Placed"], tables) == "is an event queue"
    assert _made_like_proxies(["Shipping"], tables) == "is a proxy"
    both = _made_like_proxies(["Shipping", "Shipping_Placed"], tables)
    assert both == "are proxies and NGinn event tables"


def test_an_event_table_is_never_a_written_routes_table() -> None:
    text = (
        NGINN
        + PLACED
        + (
            "routes:\n"
            "  - {name: mine, from: {connection: ng, queue: Shipping_Placed}, "
            "to: {connection: rabbit, queue: Elsewhere}}\n"
        )
    )
    [s] = [s for s in config_of(text).registry.pubsub.subscriptions() if s.endpoint == "Shipping"]
    assert s.table is not None and s.table.startswith("Shipping_") and s.table != "Shipping_Placed"
