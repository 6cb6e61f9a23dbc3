"""What the publisher's side holds of the native subscriptions the bridge makes
(`subscriptions.py`): `state` for `bridge endpoints --connect` (SQL rows read in the
subscription table, NGinn's in its own, RabbitMQ bindings through the management API, as AMQP
cannot list them), and `doubled`, `bridge check --connect`'s warnings of subscriptions whose
events arrive twice (a row or binding a bridge made for a proxy before event tables and event
queues, next to the new one). `grouped`, `nginn_row` and `proxy_endpoint` serve both modules.
"""

from __future__ import annotations

from collections.abc import Iterable

from bridge.config.models import BridgeConfig
from bridge.config.pubsub import Subscribed
from bridge.errors import BridgeError
from bridge.protocols import Transport

__all__ = ["SQL", "doubled", "grouped", "nginn_row", "proxy_endpoint", "state"]


def grouped(subscriptions: Iterable[Subscribed]) -> dict[str, list[Subscribed]]:
    """`subscriptions` by the connection each is made on, in their order."""
    out: dict[str, list[Subscribed]] = {}
    for s in subscriptions:
        out.setdefault(s.connection, []).append(s)
    return out


SQL = ("sqlserver", "postgresql", "sqlite")


def nginn_row(config: BridgeConfig, s: Subscribed) -> tuple[str, str, str]:
    row = config.registry.pubsub.nginn_row(s)
    assert row is not None, s
    return row


async def state(config: BridgeConfig) -> dict[tuple[str, str], str]:
    """(endpoint, event) -> what the publisher's side holds: `subscribed`, `missing`, `moved`
    (a row with another address), or why it could not be read: SQL rows are read in the
    subscription table, RabbitMQ bindings through the management API (AMQP cannot list them)."""
    out: dict[tuple[str, str], str] = {}
    for connection, made in grouped(config.registry.pubsub.native()).items():
        kind = config.connections[connection].type
        reader = _sql_state if kind in SQL else _rabbitmq_state
        try:
            out.update(await reader(config, connection, made))
        except BridgeError as exc:
            out.update({(s.endpoint, s.event): f"unreadable: {exc}" for s in made})
    return out


async def _sql_state(
    config: BridgeConfig, connection: str, made: list[Subscribed]
) -> dict[tuple[str, str], str]:
    from bridge.transports import load
    from bridge.transports.sql.subscriptions import SubscriptionTable
    from bridge.transports.sql.transport import Transport as SqlTransport

    transport = load(connection, config.connections[connection])
    assert isinstance(transport, SqlTransport)
    if transport.config.layout == "nginn":
        return await _nginn_state(config, transport, made)
    table = SubscriptionTable(transport.dialect, transport.config.subscription_table)
    try:
        rows = {(e, t): a for a, e, t in await table.rows()} if await table.exists() else {}
    finally:
        await table.close()
        await transport.close()
    out = {}
    for s in made:
        found = rows.get((s.endpoint, s.event))
        out[s.endpoint, s.event] = (
            "missing" if found is None else "subscribed" if found == s.address else "moved"
        )
    return out


async def _nginn_state(
    config: BridgeConfig, transport: Transport, made: list[Subscribed]
) -> dict[tuple[str, str], str]:
    """`subscribed` where NGinn's table holds the row without an expiration (the bridge writes
    none), `expiring` where it holds one with an expiration still to come, `expired` where that
    has passed by the database's clock (NGinn's publisher no longer reads the row), else
    `missing`."""
    from bridge.transports.sql.layouts.nginn_formats import parse_local
    from bridge.transports.sql.nginn_subscriptions import NGinnSubscriptionTable
    from bridge.transports.sql.transport import Transport as SqlTransport

    assert isinstance(transport, SqlTransport) and transport.config.nginn is not None
    table = NGinnSubscriptionTable(transport.dialect, transport.config.nginn.subscriptions)
    try:
        rows, now = await table.rows_and_clock() if await table.exists() else ([], None)
    finally:
        await table.close()
        await transport.close()
    held = {(p, sub, m): expires for p, sub, m, _, expires in rows}

    def of(key: tuple[str, str, str]) -> str:
        if key not in held:
            return "missing"
        expires = held[key]
        if expires is None:
            return "subscribed"
        passed = now is not None and parse_local(expires) < now
        return "expired" if passed else "expiring"

    out = {}
    for s in made:
        key = nginn_row(config, s)
        found = of(key)
        proxy = proxy_endpoint(config, s)
        if proxy is not None and of((key[0], proxy, key[2])) in ("subscribed", "expiring"):
            found += (
                f", also at {proxy}: events arrive twice"
                if found in ("subscribed", "expiring")
                else f"; at {proxy} instead: events arrive as messages, through the proxy"
            )
        out[s.endpoint, s.event] = found
    return out


def proxy_endpoint(config: BridgeConfig, s: Subscribed) -> str | None:
    """For a subscription to an NGinn publisher, the endpoint of the proxy (for Kafka
    subscribers, the first one's in the file) that a bridge subscribed before subscriptions had
    event tables: a row naming it next to the event table's delivers each event twice, once as
    a message through the proxy."""
    if s.table is None or config.registry.pubsub.nginn(s.connection) is None:
        return None
    return config.registry.address(s.queue, s.connection)


async def doubled(config: BridgeConfig) -> list[str]:
    """`bridge check --connect`'s warnings: each subscription whose events arrive twice, as
    NGinn's subscription table holds a row for its proxy too, or RabbitMQ binds the event's
    exchange to a Kafka subscriber's proxy as well as to its event queue."""
    pubsub = config.registry.pubsub
    out = await _bound_twice(config)
    made = [s for s in pubsub.native() if s.table is not None and pubsub.nginn(s.connection)]
    for connection, subscriptions in grouped(made).items():
        found = await _sql_state(config, connection, subscriptions)
        for s in subscriptions:
            if "twice" not in found[s.endpoint, s.event]:
                continue
            out.append(
                f"{connection}: warning: {s.endpoint} receives each {s.event} twice: NGinn's "
                f"subscription table holds a row for its event table ({s.address}) and one "
                f"for {proxy_endpoint(config, s)}, which a bridge wrote before subscriptions "
                f"had event tables; `bridge unsubscribe --endpoint {s.endpoint} --event "
                f"{s.event}` removes both, then `bridge subscribe` with the same arguments "
                "writes the event table's again"
            )
    return out


async def _bound_twice(config: BridgeConfig) -> list[str]:
    """The warnings of Kafka subscribers' subscriptions on RabbitMQ whose event's exchange is
    bound to a proxy too (`_kafka_proxies`)."""
    made = [
        s
        for s in config.registry.pubsub.native()
        if s.kind == "kafka" and config.connections[s.connection].type == "rabbitmq"
    ]
    out = []
    for connection, subscriptions in grouped(made).items():
        try:
            found = await _rabbitmq_state(config, connection, subscriptions)
        except BridgeError:
            continue  # `bridge endpoints --connect` says why it cannot be read
        for s in subscriptions:
            if "twice" not in found[s.endpoint, s.event]:
                continue
            out.append(
                f"{connection}: warning: {s.endpoint} receives each {s.event} twice: "
                f"{found[s.endpoint, s.event]} (a proxy's binding, which a bridge made before "
                "Kafka subscribers had event queues, sends it to that endpoint's own topic as "
                "well); delete that binding of the event's exchange (the management UI, or "
                "`DELETE /api/bindings/<vhost>/e/<exchange>/e/<proxy>/~`)"
            )
    return out


async def _rabbitmq_state(
    config: BridgeConfig, connection: str, made: list[Subscribed]
) -> dict[tuple[str, str], str]:
    from bridge.nservicebus.events import exchange_name
    from bridge.transports.rabbitmq.config import RabbitMQConnection
    from bridge.transports.rabbitmq.events import subscribed_type
    from bridge.transports.rabbitmq.management import ManagementApi, ManagementError

    model = config.connections[connection]
    assert isinstance(model, RabbitMQConnection)
    api = ManagementApi(model)
    out = {}
    for s in made:
        try:
            bindings = await api.bindings_from(exchange_name(subscribed_type(s.event)))
        except ManagementError as exc:
            out[s.endpoint, s.event] = "missing" if exc.status == 404 else f"unreadable: {exc}"
            continue
        exchanges = {
            b.get("destination")
            for b in bindings
            if b.get("destination_type") == "exchange" and b.get("routing_key") == ""
        }
        found = "subscribed" if s.queue in exchanges else "missing"
        leftover = sorted(exchanges & set(_kafka_proxies(config, s)))
        if leftover:
            found += f", also bound to {', '.join(leftover)}: events arrive twice"
        out[s.endpoint, s.event] = found
    return out


def _kafka_proxies(config: BridgeConfig, s: Subscribed) -> list[str]:
    """For a Kafka subscriber's subscription on RabbitMQ, the proxies there of the Kafka
    subscribers of its event: a binding of the event's exchange to one of them (what a bridge
    made before event queues, for the first of them) brings each event to that endpoint's own
    topic too."""
    if s.kind != "kafka":
        return []
    registry = config.registry
    return [
        registry.queue(other.endpoint, s.connection)
        for other in registry.pubsub.subscriptions()
        if other.kind == "kafka"
        and other.event == s.event
        and other.connection == s.connection
        and registry.has_place(other.endpoint, s.connection)
    ]
