"""The endpoint registry: derived routes, addresses in every transport's form, translation as
the Messaging Bridge does it, and the rules `bridge check` enforces.

Facts pinned here, from their source:
- SQL Server addresses: NServiceBus.Transport.SqlServer@214c4e8
  src/NServiceBus.Transport.SqlServer/Addressing/QueueAddress.cs:23-58 (parsing: table up to the
  first `@`, then schema and catalog, bracketed or not) and CanonicalQueueAddress.cs:29-32
  (`table@[schema]@[catalog]`).
- PostgreSQL addresses: same commit, src/NServiceBus.Transport.PostgreSql/Addressing/
  QueueAddress.cs:17-42 (split at the first `.` outside quotes) and CanonicalQueueAddress.cs:14-15.
- Translation: Particular/NServiceBus.MessagingBridge@ef463cf src/NServiceBus.MessagingBridge/
  MessageShovel.cs:25 (MessagingBridge.FailedQ removed), :40-52 (error copies: FailedQ),
  :53-57 (audit copies untouched), :58-68 (retries: the acknowledgement queue), :70-75 (other
  messages: Transfer header, reply address), :119 (an unknown address is an error naming the
  nearest match); AddressMap.cs:19-39 (an endpoint's address in every transport's form maps to
  its address on the target transport).
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest

from bridge.commands import describe_registry, render_registry
from bridge.config.loader import parse_config
from bridge.config.models import BridgeConfig, DerivedRoute
from bridge.config.registry import Registry, UnknownAddress
from bridge.envelope import Envelope, Headers
from bridge.errors import ConfigError
from bridge.routing.rules import TRANSFER, RouteRules
from bridge.transports.sql.addresses import parse_postgresql, parse_sqlserver

CONNECTIONS = """\
connections:
  legacy: {type: sqlserver, dsn: "Driver=x", schema: dbo, catalog: nsb}
  pg:     {type: postgresql, dsn: "host=127.0.0.1", schema: shop}
  rabbit: {type: rabbitmq, url: "amqp://127.0.0.1/"}
  kafka:  {type: kafka, bootstrap_servers: "127.0.0.1:9092"}
"""

REGISTRY = (
    CONNECTIONS
    + """\
endpoints:
  Sales:     {connection: legacy}
  Billing:   {connection: rabbit, concurrency: 3}
  Analytics: {connection: kafka}
  error:     {connection: pg}
  Particular.ServiceControl: {connection: pg}
proxies: {batch_size: 200}
"""
)


def config_of(text: str) -> BridgeConfig:
    return parse_config(text).config


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    return str(caught.value)


def test_every_endpoint_gets_a_proxy_and_a_route_on_every_other_connection() -> None:
    config = config_of(REGISTRY)
    routes = {r.name: r for r in config.derived_routes}
    assert len(routes) == 5 * 3
    sales = routes["proxy.rabbit.Sales"]
    assert isinstance(sales, DerivedRoute) and sales.endpoint == "Sales"
    assert (sales.from_.connection, sales.from_.queue) == ("rabbit", "Sales")
    assert (sales.to.connection, sales.to.queue) == ("legacy", "Sales")
    assert (sales.batch_size, sales.concurrency) == (200, 1)
    # A proxy on Kafka is a topic, read in a consumer group of its own.
    from_kafka = routes["proxy.kafka.Billing"]
    assert (from_kafka.from_.topic, from_kafka.from_.group) == ("Billing", "bridge.Billing")
    assert from_kafka.concurrency == 3  # the endpoint's own tuning wins
    into_kafka = routes["proxy.pg.Analytics"]
    assert (into_kafka.to.connection, into_kafka.to.topic) == ("kafka", "Analytics")
    assert config.all_routes == [*config.routes, *config.derived_routes]
    assert config.route("proxy.legacy.Billing").to.address == "Billing"


def test_proxies_only_on_the_listed_connections_and_an_endpoint_queue_of_its_own() -> None:
    config = config_of(
        CONNECTIONS
        + """\
endpoints:
  Sales:   {connection: legacy, queue: SalesInput}
  Billing: {connection: rabbit}
proxies: {connections: [legacy, rabbit]}
"""
    )
    names = sorted(r.name for r in config.derived_routes)
    assert names == ["proxy.legacy.Billing", "proxy.rabbit.Sales"]
    assert config.route("proxy.rabbit.Sales").to.queue == "SalesInput"
    registry = Registry(config)
    assert registry.address("Sales", "legacy") == "SalesInput@[dbo]@[nsb]"
    assert registry.address("Sales", "rabbit") == "Sales"


def test_sql_server_addresses_parse_as_the_transport_parses_them() -> None:
    assert parse_sqlserver("Sales") == ("Sales", None, None)
    assert parse_sqlserver("Sales@dbo") == ("Sales", "dbo", None)
    assert parse_sqlserver("Sales@[dbo]@[nsb]") == ("Sales", "dbo", "nsb")
    assert parse_sqlserver("Sales@[my@schema]@nsb") == ("Sales", "my@schema", "nsb")
    assert parse_sqlserver("Sales@[a]]b]") == ("Sales", "a]b", None)
    assert parse_sqlserver("Sales@[]@[nsb]") == ("Sales", None, "nsb")  # `@[]`: left out


def test_postgresql_addresses_parse_as_the_transport_parses_them() -> None:
    assert parse_postgresql('"public"."Sales"') == ("Sales", "public")
    assert parse_postgresql('"my.schema"."Sales"') == ("Sales", "my.schema")
    assert parse_postgresql('"a""b"."Sales"') == ("Sales", 'a"b')
    assert parse_postgresql("Sales") == ("Sales", None)


@pytest.mark.parametrize(
    ("written", "read_on"),
    [
        ("Sales@[dbo]@[nsb]", "legacy"),
        ("Sales@dbo", "legacy"),
        ("Sales", "legacy"),
        ("Sales", "rabbit"),
        ('"shop"."Sales"', "pg"),
        ("Sales@[dbo]@[nsb]", "rabbit"),  # a SQL Server address that crossed unchanged
    ],
)
def test_an_address_in_any_form_translates_to_every_connection(written: str, read_on: str) -> None:
    registry = Registry(config_of(REGISTRY))
    translated = {c: registry.translate(written, read_on, c, "h") for c in registry.connections()}
    assert translated == {
        "legacy": "Sales@[dbo]@[nsb]",
        "pg": '"shop"."Sales"',
        "rabbit": "Sales",
        "kafka": "Sales",
    }


def test_an_unknown_address_names_the_nearest_endpoint() -> None:
    registry = Registry(config_of(REGISTRY))
    with pytest.raises(UnknownAddress, match="nearest: 'Sales', which differs only in case"):
        registry.translate("sales", "rabbit", "legacy", "NServiceBus.ReplyToAddress")
    with pytest.raises(UnknownAddress, match=r"'Biling'.*nearest: 'Billing'"):
        registry.translate("Biling", "rabbit", "legacy", "NServiceBus.ReplyToAddress")
    with pytest.raises(UnknownAddress, match="no address on 'legacy'"):
        registry.translate("Sales@[dbo]@[other]", "legacy", "legacy", "h")  # another catalog


def rules_for(route_name: str) -> RouteRules:
    config = config_of(REGISTRY)
    return RouteRules(config.route(route_name), Registry(config))


def forward(rules: RouteRules, *headers: tuple[str, str]) -> dict[str, str | None]:
    return rules(
        Envelope(Headers([("NServiceBus.MessageId", "m1"), *headers]), b"{}")
    ).headers.to_dict()


def test_a_message_gets_the_transfer_header_and_its_reply_address_translated() -> None:
    out = forward(rules_for("proxy.rabbit.Sales"), ("NServiceBus.ReplyToAddress", "Billing"))
    assert out["NServiceBus.ReplyToAddress"] == "Billing@[dbo]@[nsb]"
    assert out[TRANSFER] == "rabbit->legacy"
    with pytest.raises(UnknownAddress, match=r"NServiceBus\.ReplyToAddress 'Shipping'"):
        forward(rules_for("proxy.rabbit.Sales"), ("NServiceBus.ReplyToAddress", "Shipping"))


def test_an_error_copy_has_its_failed_queue_translated_and_no_transfer_header() -> None:
    out = forward(
        rules_for("proxy.rabbit.error"),
        ("NServiceBus.FailedQ", "Billing"),
        ("NServiceBus.ReplyToAddress", "NotRegistered"),  # kept: FailedQ is what matters
        ("NServiceBus.MessagingBridge.FailedQ", "x"),
    )
    assert out["NServiceBus.FailedQ"] == '"shop"."Billing"'
    assert out["NServiceBus.ReplyToAddress"] == "NotRegistered"
    assert TRANSFER not in out and "NServiceBus.MessagingBridge.FailedQ" not in out
    with pytest.raises(UnknownAddress, match=r"NServiceBus\.FailedQ 'Nobody'"):
        forward(rules_for("proxy.rabbit.error"), ("NServiceBus.FailedQ", "Nobody"))


def test_an_audit_copy_crosses_untouched() -> None:
    headers = (
        ("NServiceBus.ProcessingEnded", "2026-01-01 00:00:00:000000 Z"),
        ("NServiceBus.ReplyToAddress", "NotRegistered"),
    )
    out = forward(rules_for("proxy.rabbit.error"), *headers)
    assert out == {"NServiceBus.MessageId": "m1", **dict(headers)}


def test_a_retry_has_its_acknowledgement_queue_translated() -> None:
    out = forward(
        rules_for("proxy.pg.Billing"),
        ("ServiceControl.Retry.UniqueMessageId", "u1"),
        ("ServiceControl.Retry.AcknowledgementQueue", '"shop"."Particular.ServiceControl"'),
        ("NServiceBus.ReplyToAddress", '"shop"."Sales"'),
    )
    assert out["ServiceControl.Retry.AcknowledgementQueue"] == "Particular.ServiceControl"
    assert out["NServiceBus.ReplyToAddress"] == "Sales"
    assert TRANSFER not in out


def manual_route_rules() -> RouteRules:
    """The rules of a written PostgreSQL -> RabbitMQ route with an address map, beside the
    registry."""
    config = config_of(
        REGISTRY
        + """\
routes:
  - name: manual
    from: {connection: pg, queue: Inbox}
    to: {connection: rabbit, queue: Inbox}
    address_map: {'"shop"."Sales"': Sales-mapped}
"""
    )
    return RouteRules(config.route("manual"), Registry(config))


def test_written_routes_keep_their_address_map_only() -> None:
    rules = manual_route_rules()
    out = forward(rules, ("NServiceBus.ReplyToAddress", '"shop"."Sales"'))
    assert out["NServiceBus.ReplyToAddress"] == "Sales-mapped"
    assert TRANSFER not in out
    assert (
        forward(rules, ("NServiceBus.ReplyToAddress", "Unknown"))["NServiceBus.ReplyToAddress"]
        == "Unknown"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            CONNECTIONS + "endpoints:\n  Sales: {connection: legacy}\n  Sales: {connection: pg}\n",
            "routes.yaml:8:3: endpoint 'Sales' is registered twice: an endpoint lives on exactly "
            "one connection",
        ),
        (
            CONNECTIONS + "endpoints:\n  Sales: {connection: legacy}\n  sales: {connection: pg}\n",
            "routes.yaml:8:3: endpoints 'Sales' and 'sales' differ only in case",
        ),
        (
            CONNECTIONS + "endpoints:\n  Sales: {connection: nowhere}\n",
            "routes.yaml:7:23: endpoint 'Sales' names connection 'nowhere', which is not defined",
        ),
        (
            CONNECTIONS
            + "endpoints:\n  Sales: {connection: legacy}\nproxies: {error_queue: SALES}\n",
            "routes.yaml:8:24: error queue 'SALES' is named like endpoint 'Sales'",
        ),
        (
            CONNECTIONS + "endpoints:\n  bridge.error: {connection: legacy}\n",
            "routes.yaml:7:3: error queue 'bridge.error' is named like endpoint 'bridge.error'",
        ),
        (
            CONNECTIONS
            + "endpoints:\n  Sales: {connection: legacy}\nproxies: {connections: [legacy]}\n",
            "routes.yaml:6:1: the endpoint registry needs at least two connections",
        ),
        (
            CONNECTIONS
            + "endpoints:\n  Sales: {connection: legacy}\nproxies: {connections: [legacy, nope]}\n",
            "routes.yaml:8:33: proxies: no connection named 'nope'",
        ),
        (
            CONNECTIONS + "endpoints:\n  Sales Dept: {connection: legacy}\n",
            "routes.yaml:7:3: endpoint name 'Sales Dept': use letters, digits",
        ),
        (
            CONNECTIONS + "endpoints:\n  Sales!: {connection: rabbit}\n",
            "routes.yaml:7:3: endpoint name 'Sales!'",
        ),
        (
            CONNECTIONS
            + "endpoints:\n  Sales: {connection: legacy}\nroutes:\n"
            + "  - {name: mine, from: {connection: rabbit, queue: Sales},\n"
            + "     to: {connection: pg, queue: X}}\n",
            "routes.yaml:9:24: route 'mine' reads 'Sales' on 'rabbit', the proxy of endpoint "
            "'Sales'",
        ),
        (
            CONNECTIONS
            + "endpoints:\n  Sales: {connection: legacy}\nroutes:\n"
            + "  - {name: proxy.pg.Sales, from: {connection: pg, queue: A},\n"
            + "     to: {connection: pg, queue: B}}\n",
            "routes.yaml:9:12: route name 'proxy.pg.Sales' is the name of a route the registry "
            "derives",
        ),
    ],
)
def test_registry_rules_are_enforced_at_their_place(text: str, expected: str) -> None:
    message = error_of(text)
    assert message.startswith(expected), message


def test_a_proxy_name_the_other_transport_refuses_is_found_by_check() -> None:
    long_name = "S" * 60  # fine for SQL Server and RabbitMQ, over PostgreSQL's 55 bytes
    message = error_of(CONNECTIONS + f"endpoints:\n  {long_name}: {{connection: rabbit}}\n")
    assert message.startswith(f"routes.yaml:7:3: endpoint '{long_name}' (its proxy on 'pg')")
    assert "55" in message


def test_a_written_route_between_transports_without_an_address_map_is_warned_about() -> None:
    text = (
        CONNECTIONS
        + "routes:\n"
        + "  - {name: out, from: {connection: legacy, queue: A},\n"
        + "     to: {connection: rabbit, queue: A}}\n"
        + "  - {name: feed, from: {connection: legacy, queue: B},\n"
        + "     to: {connection: kafka, topic: b}}\n"
    )
    warnings = parse_config(text).warnings
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("routes.yaml:7:12: warning: route 'out' crosses from sqlserver")
    mapped = text.replace("queue: A}}", "queue: A}, address_map: {a: b}}", 1)
    assert parse_config(mapped).warnings == []


def test_bridge_endpoints_shows_every_address_and_route() -> None:
    report = describe_registry(config_of(REGISTRY))
    json.dumps(report)  # what --json prints
    sales = next(e for e in report["endpoints"] if e["name"] == "Sales")
    assert sales["connection"] == "legacy"
    assert sales["addresses"]["legacy"] == {
        "queue": "Sales",
        "address": "Sales@[dbo]@[nsb]",
        "proxy": False,
        "route": None,
    }
    assert sales["addresses"]["pg"]["route"] == "proxy.pg.Sales"
    assert sales["addresses"]["pg"]["address"] == '"shop"."Sales"'
    assert len(report["routes"]) == 15
    text = render_registry(report)
    assert "Sales (lives on legacy)" in text
    assert textwrap.dedent(text).count("proxy, route proxy.") == 15


def test_routes_shows_which_endpoint_a_derived_route_serves() -> None:
    from bridge.routing.runner import RouteRunner
    from bridge.service.api import route_report

    config = config_of(
        REGISTRY
        + "routes:\n  - {name: manual, from: {connection: pg, queue: A}, "
        + "to: {connection: pg, queue: B}}\n"
    )

    def no_endpoints() -> Any:
        raise AssertionError("not started")

    runners = [
        RouteRunner(config.route(name), no_endpoints) for name in ("manual", "proxy.pg.Sales")
    ]
    report = {r["name"]: r for r in route_report(runners)}
    assert report["manual"]["endpoint"] is None
    assert report["proxy.pg.Sales"]["endpoint"] == "Sales"
    assert report["proxy.pg.Sales"]["from"] == {"connection": "pg", "address": "Sales"}


def test_a_written_route_leaves_an_audit_copys_addresses_alone() -> None:
    rules = manual_route_rules()
    audit = forward(
        rules,
        ("NServiceBus.ProcessingEnded", "2026-01-01 00:00:00:000000 Z"),
        ("NServiceBus.ReplyToAddress", '"shop"."Sales"'),
    )
    assert audit["NServiceBus.ReplyToAddress"] == '"shop"."Sales"'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (  # A's own queue is the table B, which is B's proxy on pg
            CONNECTIONS
            + "endpoints:\n  A: {connection: pg, queue: B}\n  B: {connection: rabbit}\n",
            "routes.yaml:8:3: endpoint 'B': 'B' on 'pg' would be both 'A''s own queue and the "
            "proxy of 'B'",
        ),
        (
            CONNECTIONS.replace(", catalog: nsb", "")
            + "endpoints:\n  Sales: {connection: legacy}\n",
            "routes.yaml:2:3: connections.legacy: the endpoint registry needs `catalog`",
        ),
        (
            CONNECTIONS.replace("  kafka:", "  a.b:", 1).replace("  pg: ", "  a: ", 1)
            + "endpoints:\n  c: {connection: legacy}\n  b.c: {connection: legacy}\n",
            "routes.yaml:8:3: endpoint 'b.c': its route from 'a' would be named 'proxy.a.b.c'",
        ),
        (
            CONNECTIONS
            + "endpoints:\n  Sales: {connection: legacy}\nproxies: {error_queue: 'bad name!'}\n",
            "routes.yaml:8:24: proxies.error_queue on 'kafka': Kafka topic name 'bad name!'",
        ),
    ],
)
def test_more_registry_rules(text: str, expected: str) -> None:
    message = error_of(text)
    assert message.startswith(expected), message


def test_registry_warnings() -> None:
    only_two = CONNECTIONS + (
        "endpoints:\n  Sales: {connection: legacy}\n  Billing: {connection: kafka}\n"
    )
    warnings = parse_config(only_two).warnings
    assert any("connection 'pg' hosts no endpoint" in w for w in warnings), warnings
    listed = only_two + "proxies: {connections: [legacy, rabbit]}\n"
    warnings = parse_config(listed).warnings
    assert any("connection 'kafka' hosts endpoints but no proxies" in w for w in warnings)
    registry = Registry(config_of(listed))
    with pytest.raises(UnknownAddress, match="has no proxy on 'kafka'"):
        registry.translate("Sales", "rabbit", "kafka", "NServiceBus.ReplyToAddress")


def test_sql_server_schemas_and_catalogs_compare_without_case() -> None:
    registry = Registry(config_of(REGISTRY))
    assert registry.translate("Sales@[DBO]@[NSB]", "legacy", "rabbit", "h") == "Sales"
    with pytest.raises(UnknownAddress, match=r"nearest: 'Sales', whose address on 'legacy'"):
        registry.translate("Sales@[dbo]@[other]", "legacy", "rabbit", "h")


def test_a_derived_route_keeps_a_messages_delay_request_and_lifetime() -> None:
    """A delay asked for on Kafka crosses a derived route's rules (they rebuild the headers)."""
    message = Envelope(Headers([("NServiceBus.MessageId", "m1")]), b"{}")
    message.deliver_at, message.expires_at = 2_000_000_000.0, 2_000_000_060.0
    out = rules_for("proxy.rabbit.Sales")(message)
    assert out.headers.get(TRANSFER) == "rabbit->legacy"
    assert (out.deliver_at, out.expires_at) == (2_000_000_000.0, 2_000_000_060.0)
