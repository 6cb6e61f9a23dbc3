"""`bridge check`, `bridge install` and `bridge subscribe|unsubscribe`: validating the config
and reaching what it names, creating what the routes need, native subscriptions by hand."""

from __future__ import annotations

import sys

from bridge.commands.common import (
    addresses,
    by_connection,
    describe_counts,
    exists,
    load_routes,
    sources,
    transport_for,
)
from bridge.config.models import BridgeConfig
from bridge.errors import AccessRefused, BridgeError, TransportUnavailable
from bridge.protocols import PreparesSources, Transport
from bridge.service.capacity import connection_warnings
from bridge.transports.sql.config import KINDS as SQL_KINDS
from bridge.transports.sql.transport import Transport as SqlTransport


async def check(config_path: str, *, connect: bool) -> int:
    """Validate the config; with `connect`, reach every connection and each address it needs,
    and warn where the routes could need more server connections than are left
    (`bridge.service.capacity`)."""
    config = load_routes(config_path).config
    print(f"{config_path}: OK ({describe_counts(config)})")
    if not connect:
        return 0
    failures = 0
    proxies: dict[str, list[str]] = {}
    for place in config.registry.proxies():
        proxies.setdefault(place.connection, []).append(place.queue)
    pubsub = config.registry.pubsub
    # An NGinn event table, or a Kafka subscribers' event queue: what each is.
    tables = {
        (s.connection, s.table): "NGinn event table"
        if pubsub.nginn(s.connection)
        else "event queue"
        for s in pubsub.subscriptions()
        if s.table is not None
    }
    for s in pubsub.subscriptions():
        if s.table is not None and s.table not in proxies.get(s.connection, []):
            proxies.setdefault(s.connection, []).append(s.table)
    delayed = delayed_destinations(config)
    for name, needed in addresses(config).items():
        transport = transport_for(config, name)
        try:
            warnings = await transport.check(needed)
            if delayed.get(name) and isinstance(transport, SqlTransport):
                warnings += await transport.check_delayed(delayed[name])
            warnings += await connection_warnings(config, name, transport)
        except BridgeError as exc:
            failures += 1
            print(f"{name}: FAILED: {exc}")
            reached = not isinstance(exc, AccessRefused | TransportUnavailable)
            if reached and proxies.get(name) and not config.proxies.create:
                missing = [q for q in proxies[name] if not await exists(transport, q)]
                if missing:
                    here = {t: kind for (c, t), kind in tables.items() if c == name}
                    what = _made_like_proxies(missing, here)
                    print(
                        f"{name}: note: {', '.join(missing)} {what}, which `bridge install` "
                        "creates only with `proxies: {create: true}` (it needs the rights to); "
                        "otherwise create them as the endpoints' own installers would"
                    )
            continue
        finally:
            await transport.close()
        print(f"{name}: OK ({', '.join(needed)})")
        for warning in warnings:
            print(f"{name}: warning: {warning}")
    if config.delays is not None and not await _check_delays(config, config.delays.connection):
        failures += 1
    if not failures and tables:
        from bridge.service.subscription_state import doubled

        for warning in await doubled(config):  # a proxy's row or binding next to the new one
            print(warning)
    return 1 if failures else 0


def delayed_destinations(config: BridgeConfig) -> dict[str, list[str]]:
    """The SQL queue tables that may be sent delayed messages, by connection: the
    destinations of the routes (the registry's too) from Kafka, whose records may ask for a
    delay (`bridge.nservicebus.delays`); other sources' messages never carry one."""
    ends = [
        (route.to.connection, route.to.address)
        for route in config.all_routes
        if not route.publish
        and config.connections[route.from_.connection].type == "kafka"
        and config.connections[route.to.connection].type in SQL_KINDS
    ]
    return by_connection(ends)


def _made_like_proxies(missing: list[str], made: dict[str, str]) -> str:
    """`is a proxy`, `are event tables`, ...: what the missing tables or queues are (`made`:
    the event tables' and queues' kinds; any other is a proxy)."""
    kinds = list(dict.fromkeys(made.get(name, "proxy") for name in missing))
    if len(missing) == 1:
        return f"is an {kinds[0]}" if kinds[0] != "proxy" else "is a proxy"
    plural = {"proxy": "proxies", "NGinn event table": "NGinn event tables"}
    plural["event queue"] = "event queues"
    return "are " + " and ".join(plural[k] for k in kinds)


async def _check_delays(config: BridgeConfig, name: str) -> bool:
    """Whether the `delays:` connection's `BridgeDelays` is there (printed either way)."""
    transport = transport_for(config, name)
    assert isinstance(transport, SqlTransport)  # `bridge check` makes sure
    assert config.delays is not None
    error_queue = config.delays.error_queue
    try:
        await transport.check_delay_table(error_queue)
    except BridgeError as exc:
        print(f"{name}: FAILED: {exc}")
        return False
    finally:
        await transport.close()
    print(f"{name}: OK (BridgeDelays, {error_queue})")
    return True


async def install(config_path: str, *, print_only: bool) -> int:
    """Create what every route needs, or with `print_only` print each transport's statements."""
    config = load_routes(config_path, offline=print_only).config
    received = sources(config, installing=True)
    for name, needed in addresses(config, installing=True).items():
        transport = transport_for(config, name)
        prepared: list[str] = []
        try:
            statements = await transport.install(needed, print_only=print_only)
            if isinstance(transport, PreparesSources) and received.get(name):
                prepared = await transport.prepare_sources(received[name], print_only=print_only)
        finally:
            await transport.close()
        if print_only:
            comment = getattr(transport, "print_comment", "--")  # shell commands: "#"
            print(f"{comment} connection {name} ({config.connections[name].type})")
            for statement in statements + prepared:  # each transport's own runnable form
                print(statement + "\n")
        else:
            print(f"{name}: installed {', '.join(needed)}")
            for done in prepared:
                print(f"{name}: created {done}")
    if config.delays is not None:  # where delays wait for Kafka (`bridge.service.delaying`)
        await _install_delays(config, config.delays.connection, print_only)
    if print_only:
        for statement in subscription_statements(config):
            print(statement + "\n")
        return 0
    from bridge.service.subscriptions import EventTablesMissing, subscribe_all

    transports: dict[str, Transport] = {}
    try:
        for line in await subscribe_all(config, transports):
            print(line)
    except EventTablesMissing as exc:
        for line in exc.done:
            print(line)
        print(f"bridge install: {exc}", file=sys.stderr)
        return 1
    finally:
        for transport in transports.values():
            await transport.close()
    return 0


def subscription_statements(config: BridgeConfig) -> list[str]:
    """What `install --print-sql` prints for the registry's subscriptions: a comment naming
    them, then each SQL connection's subscription table (SubscriptionRouting, or NGinn's on
    NGinn tables; its rows are written when the bridge runs), or on RabbitMQ the exchanges and
    bindings as management API requests."""

    made = config.registry.pubsub.native()
    out: list[str] = []
    for name in dict.fromkeys(s.connection for s in made):
        connection = config.connections[name]
        comment = "--" if connection.type in SQL_KINDS else "#"
        lines = [
            f"{comment} subscriptions on {name}: "
            + ", ".join(
                f"{s.endpoint} to {s.event} at {s.address or s.queue}"
                for s in made
                if s.connection == name
            )
        ]
        if connection.type in SQL_KINDS:
            transport = transport_for(config, name)
            from bridge.transports.sql.subscriptions import statements
            from bridge.transports.sql.transport import Transport as SqlTransport

            assert isinstance(transport, SqlTransport)
            dialect = transport.dialect
            options = transport.config.nginn
            if transport.config.layout == "nginn" and options is not None:
                from bridge.transports.sql import nginn_subscriptions

                nginn = nginn_subscriptions.statements(dialect, options.subscriptions)
                lines += dialect.printable([nginn.create])
            else:
                table = statements(dialect, transport.config.subscription_table)
                lines += dialect.printable([table.create])
        else:
            from bridge.transports.rabbitmq.config import RabbitMQConnection
            from bridge.transports.rabbitmq.events import printed, subscribe

            assert isinstance(connection, RabbitMQConnection)
            for s in made:
                if s.connection == name:
                    lines += printed(connection, subscribe(s.event, s.queue))
        out.append("\n".join(lines))
    return out


async def subscription(config_path: str, endpoint: str, event: str, *, subscribe: bool) -> int:
    """`bridge subscribe` / `bridge unsubscribe`: one endpoint's native subscription by hand."""
    from bridge.service.subscriptions import change

    config = load_routes(config_path).config
    print(await change(config, endpoint, event, subscribe=subscribe))
    return 0


async def _install_delays(config: BridgeConfig, name: str, print_only: bool) -> None:
    transport = transport_for(config, name)
    assert isinstance(transport, SqlTransport)  # `bridge check` makes sure
    try:
        assert config.delays is not None
        statements = await transport.install_delay_table(
            config.delays.error_queue, print_only=print_only
        )
    finally:
        await transport.close()
    if print_only:
        print(f"-- delays on connection {name} ({config.connections[name].type})")
        for statement in statements:
            print(statement + "\n")
    else:
        print(f"{name}: installed BridgeDelays and {config.delays.error_queue}")
