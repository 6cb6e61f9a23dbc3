"""Helpers every command shares: the config as commands load it, the addresses each
connection needs, and transports by connection name."""

from __future__ import annotations

import sys
from collections.abc import Iterable

from bridge.config.loader import LoadedConfig, load_config
from bridge.config.models import BridgeConfig, DerivedRoute, Route
from bridge.errors import BridgeError, UsageError
from bridge.protocols import Transport
from bridge.telemetry.redact import redactor
from bridge.transports import load


def load_routes(path: str, *, offline: bool = False) -> LoadedConfig:
    """The config at `path`, its warnings printed and its secrets known to the redactor.

    `offline`: nothing will connect, so no credentials are needed, only names.
    """
    loaded = load_config(path, offline=offline)
    for warning in loaded.warnings:
        print(warning, file=sys.stderr)
    for connection in loaded.config.connections.values():
        for attr in ("dsn", "url", "management_url"):
            value = getattr(connection, attr, None)
            if isinstance(value, str):
                redactor.add_from_dsn(value)
        redactor.add([getattr(connection, "sasl_password", None)])
    return loaded


def addresses(config: BridgeConfig, *, installing: bool = False) -> dict[str, list[str]]:
    """Every address each connection needs: sources, destinations and error queues.

    `installing`: what `bridge install` creates. The registry's endpoints own their queues; the
    proxies and their error queues are created only with `proxies: {create: true}`.
    """
    ends = []
    for route in config.all_routes:
        if proxy_left_alone(config, route, installing):
            continue
        ends.append((route.from_.connection, route.from_.address))
        # An endpoint's own queue is the endpoint's to make; an event route publishes.
        own = installing and isinstance(route, DerivedRoute)
        if not (own or route.publish):
            ends.append((route.to.connection, route.to.address))
        error_queue = config.error_queue_of(route)
        if error_queue is not None:
            ends.append((route.from_.connection, error_queue))
    for connection, topics in config.registry.pubsub.event_topics().items():
        ends += [(connection, topic) for topic in topics]  # where events go to Kafka, once
    return by_connection(ends)


def describe_counts(config: BridgeConfig) -> str:
    """`2 connections, 1 route, 4 derived from 3 endpoints`."""

    def count(n: int, word: str) -> str:
        return f"{n} {word}{'' if n == 1 else 's'}"

    out = f"{count(len(config.connections), 'connection')}, {count(len(config.routes), 'route')}"
    if config.endpoints:
        out += f", {len(config.derived_routes)} derived from "
        out += count(len(config.endpoints), "endpoint")
    return out


def sources(config: BridgeConfig, *, installing: bool = False) -> dict[str, list[str]]:
    """The addresses each connection's routes receive from (`installing`: of the routes whose
    sources `bridge install` makes: not proxies unless `proxies: {create: true}`)."""
    return by_connection(
        (route.from_.connection, route.from_.address)
        for route in config.all_routes
        if not proxy_left_alone(config, route, installing)
    )


def proxy_left_alone(config: BridgeConfig, route: Route, installing: bool) -> bool:
    """Whether `bridge install` leaves `route` alone: a derived route's proxy and error queue
    are made only with `proxies: {create: true}`."""
    return installing and isinstance(route, DerivedRoute) and not config.proxies.create


def by_connection(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """(connection, address) pairs as each connection's addresses, each once, in order."""
    out: dict[str, list[str]] = {}
    for connection, address in pairs:
        bucket = out.setdefault(connection, [])
        if address not in bucket:
            bucket.append(address)
    return out


def known_connection(config: BridgeConfig, name: str) -> None:
    if name not in config.connections:
        known = ", ".join(sorted(config.connections)) or "none"
        raise UsageError(f"no connection named {name!r} in the config (known: {known})")


def transport_for(config: BridgeConfig, name: str) -> Transport:
    known_connection(config, name)
    return load(name, config.connections[name])


async def exists(transport: Transport, address: str) -> bool:
    try:
        await transport.check([address])
    except BridgeError:
        return False
    return True
