"""The cross-field rules of routes.yaml, one precise message each, at `FILE:LINE:COL`.

Rules that belong to one connection type (Kafka's security settings, RabbitMQ's URL, each
transport's names) live with that transport in its driver-free `config.py`, listed in `RULES`.
A route whose two ends are one table, topic or queue loops, also when two connection names
reach it (`bridge.config.places`). The rules of publish/subscribe are in `lint_pubsub.py`,
those of credentials in `credentials.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge.config import lint_pubsub
from bridge.config.kinds import RULES
from bridge.config.models import (
    ROUTE_NAME,
    BridgeConfig,
    ConnectionConfig,
    DerivedRoute,
    Endpoint,
    Route,
)
from bridge.config.names import address_name, nginn_width
from bridge.config.places import place
from bridge.config.registry import Place, Registry
from bridge.errors import ConfigError
from bridge.nservicebus.deadletter import DEFAULT_ERROR_QUEUE
from bridge.transports.sql.config import KINDS as SQL_KINDS
from bridge.transports.sql.config import (
    NGINN_ENDPOINT_CHARS,
)

if TYPE_CHECKING:
    from bridge.config.loader import Positions

__all__ = [
    "RULES",
    "connection_warnings",
    "lint",
    "registry_warnings",
    "route_warnings",
]


def _endpoint(
    config: BridgeConfig, endpoint: Endpoint, role: str, path: tuple[str | int, ...], at: Positions
) -> None:
    """Check one route end against its connection."""
    connection = config.connections.get(endpoint.connection)
    if connection is None:
        known = ", ".join(sorted(config.connections)) or "none"
        raise ConfigError(
            f"{role} names connection {endpoint.connection!r}, which is not defined "
            f"(known: {known})",
            at.at((*path, "connection")),
        )
    kind = connection.type
    rules = RULES[kind]
    key, other = ("topic", "queue") if rules.ADDRESS_KEY == "topic" else ("queue", "topic")
    if getattr(endpoint, key) is None or getattr(endpoint, other) is not None:
        name = "Kafka" if kind == "kafka" else kind
        raise ConfigError(
            f"{role} is the {name} connection {endpoint.connection!r}: name a `{key}`, "
            f"not a `{other}`",
            at.at(path),
        )
    if rules.SOURCE_GROUP and role == "from" and not endpoint.group:
        raise ConfigError("a Kafka source needs a consumer `group`", at.at((*path, "topic")))
    if endpoint.group is not None and not (rules.SOURCE_GROUP and role == "from"):
        raise ConfigError("`group` is only for Kafka sources", at.at((*path, "group")))
    address = endpoint.address
    if not address.strip() or "\x00" in address:
        raise ConfigError(f"{role}: empty or invalid name {address!r}", at.at(path))
    address_name(kind, address, role, at.at((*path, "queue" if endpoint.queue else "topic")))


def _loop(config: BridgeConfig, route: Route) -> str | None:
    """Why `route` would forward each message back where it took it from, or None."""
    ends = (route.from_, route.to)
    if ends[0].connection == ends[1].connection and ends[0].address == ends[1].address:
        return "from and to are the same place: the route would loop"
    source, destination = (place(config.connections[e.connection], e.address) for e in ends)
    if source is None or destination is None or not source.same_as(destination):
        return None
    return (
        f"from and to are the same place: connections {ends[0].connection!r} and "
        f"{ends[1].connection!r} both reach {destination.shown}, so the route would loop"
    )


def _connection(name: str, connection: ConnectionConfig, at: Positions) -> None:
    """The rules of the connection's own transport, at the key each is about."""
    for key, problem in RULES[connection.type].lint(connection):
        path: tuple[str | int, ...] = ("connections", name) + (tuple(key.split(".")) if key else ())
        raise ConfigError(f"connections.{name}: {problem}", at.at(path))


def lint(config: BridgeConfig, at: Positions) -> None:
    """Raise ConfigError for the first rule a valid-shaped config breaks."""
    for name, connection in config.connections.items():
        _connection(name, connection, at)
    seen: set[str] = set()
    for i, route in enumerate(config.routes):
        path: tuple[str | int, ...] = ("routes", i)
        if route.name in seen:
            raise ConfigError(f"duplicate route name {route.name!r}", at.at((*path, "name")))
        seen.add(route.name)
        _endpoint(config, route.from_, "from", (*path, "from"), at)
        if route.publish:
            lint_pubsub.publishes(config, route, path, at)
        else:
            _endpoint(config, route.to, "to", (*path, "to"), at)
        loop = None if route.publish else _loop(config, route)
        if loop is not None:
            raise ConfigError(loop, at.at((*path, "to")))
        if route.error_queue is not None:
            where = at.at((*path, "error_queue"))
            # Empty means the default, `bridge.error`.
            if "\x00" in route.error_queue or (route.error_queue and not route.error_queue.strip()):
                raise ConfigError(f"error_queue: invalid name {route.error_queue!r}", where)
            source = config.connections[route.from_.connection].type
            address_name(source, route.error_queue, "error_queue", where)
        for old, new in route.headers.rename.items():
            if not old or not new:
                raise ConfigError("header names cannot be empty", at.at((*path, "headers")))
    lint_pubsub.events(config, at)
    if config.endpoints:
        _registry(config, at)
    if config.delays is not None:
        _delays(config, config.delays.connection, at)


def _delays(config: BridgeConfig, name: str, at: Positions) -> None:
    """`delays: {connection}` names a SQL connection (messaging-bridge.md §4)."""
    where = at.at(("delays", "connection"))
    if name not in config.connections:
        known = ", ".join(sorted(config.connections)) or "none"
        raise ConfigError(f"delays.connection: no connection {name!r} (known: {known})", where)
    kind = config.connections[name].type
    if kind not in SQL_KINDS:
        raise ConfigError(
            f"delays.connection: {name!r} is a {kind} connection; delays wait in a table of a "
            "SQL connection (sqlite, postgresql, sqlserver)",
            where,
        )
    _delays_error_queue(config, name, at)


def _delays_error_queue(config: BridgeConfig, name: str, at: Positions) -> None:
    """`delays: {error_queue}` is a valid queue name on the `delays:` connection, not named
    like an endpoint (as every error queue, `_error_queues`), and no route receives from it:
    the error copies of delayed messages would be forwarded, and could cross again."""
    assert config.delays is not None
    queue = config.delays.error_queue
    where = at.at(("delays", "error_queue"))
    if "\x00" in queue or not queue.strip():
        raise ConfigError(f"delays.error_queue: invalid name {queue!r}", where)
    connection = config.connections[name]
    address_name(connection.type, queue, "delays.error_queue", where)
    folded = {endpoint.casefold(): endpoint for endpoint in config.endpoints}
    endpoint = folded.get(queue.casefold())
    if endpoint is not None:
        raise ConfigError(
            f"delays.error_queue: error queue {queue!r} is named like endpoint {endpoint!r}: "
            "delayed messages that can never be sent would be delivered to the endpoint; name "
            "another error queue",
            where,
        )
    mine = place(connection, queue)
    for route in config.all_routes:
        source = route.from_
        same = source.connection == name and source.address == queue
        if not same and mine is not None:
            theirs = place(config.connections[source.connection], source.address)
            same = theirs is not None and mine.same_as(theirs)
        if same:
            raise ConfigError(
                f"delays.error_queue: {queue!r} on connection {name!r} is where route "
                f"{route.name!r} receives from: the error copies of delayed messages that can "
                "never be sent would be forwarded again; name a queue no route reads",
                where,
            )


def _registry(config: BridgeConfig, at: Positions) -> None:
    """The rules of `endpoints:` and `proxies:` (messaging-bridge.md §1 and §4)."""
    known = ", ".join(sorted(config.connections)) or "none"
    listed = config.proxies.connections
    for i, name in enumerate(listed or ()):
        where = at.at(("proxies", "connections", i))
        if name not in config.connections:
            raise ConfigError(f"proxies: no connection named {name!r} (known: {known})", where)
        if name in (listed or [])[:i]:
            raise ConfigError(f"proxies: connection {name!r} is listed twice", where)
    by_folded: dict[str, str] = {}
    for name, endpoint in config.endpoints.items():
        path: tuple[str | int, ...] = ("endpoints", name)
        if endpoint.connection not in config.connections:
            raise ConfigError(
                f"endpoint {name!r} names connection {endpoint.connection!r}, which is not "
                f"defined (known: {known})",
                at.at((*path, "connection")),
            )
        if not ROUTE_NAME.match(name):
            raise ConfigError(
                f"endpoint name {name!r}: use letters, digits, '.', '_' and '-' (it names the "
                "endpoint's proxies and their routes)",
                at.at(path, key=True),
            )
        other = by_folded.setdefault(name.casefold(), name)
        if other != name:
            raise ConfigError(
                f"endpoints {other!r} and {name!r} differ only in case: addresses are matched "
                "exactly, so one of them would never receive; register one spelling",
                at.at(path, key=True),
            )
        if endpoint.queue is not None:
            kind = config.connections[endpoint.connection].type
            address_name(kind, endpoint.queue, f"endpoint {name!r}", at.at((*path, "queue")))
    registry = config.registry
    connections = registry.connections()
    if len(connections) < 2:
        raise ConfigError(
            "the endpoint registry needs at least two connections: an endpoint has proxies on "
            "the connections it does not live on",
            at.at(("endpoints",), key=True),
        )
    for connection in connections:
        if not ROUTE_NAME.match(connection):
            raise ConfigError(
                f"connection name {connection!r}: use letters, digits, '.', '_' and '-' (it "
                "names the routes of the proxies on it)",
                at.at(("connections", connection), key=True),
            )
        model = config.connections[connection]
        if model.type == "sqlserver" and not model.catalog:
            raise ConfigError(
                f"connections.{connection}: the endpoint registry needs `catalog` (the database) "
                "on SQL Server connections: addresses carry it as NServiceBus writes them "
                "(`Sales@[dbo]@[catalog]`)",
                at.at(("connections", connection), key=True),
            )
    for first, second in registry.collisions():

        def role(place: Place) -> str:
            return (
                f"the proxy of {place.endpoint!r}"
                if place.proxy
                else f"{place.endpoint!r}'s own queue"
            )

        raise ConfigError(
            f"endpoint {second.endpoint!r}: {second.queue!r} on {second.connection!r} would be "
            f"both {role(first)} and {role(second)}: one queue cannot be both",
            at.at(("endpoints", second.endpoint), key=True),
        )
    for proxy in registry.proxies():
        kind = config.connections[proxy.connection].type
        address_name(
            kind,
            proxy.queue,
            f"endpoint {proxy.endpoint!r} (its proxy on {proxy.connection!r})",
            at.at(("endpoints", proxy.endpoint), key=True),
        )
    for place_ in registry.places():
        if getattr(config.connections[place_.connection], "layout", None) == "nginn":
            what = "proxy" if place_.proxy else "queue"
            nginn_width(
                place_.address,
                NGINN_ENDPOINT_CHARS,
                f"{what} endpoint of {place_.endpoint!r} on {place_.connection!r} (to_endpoint)",
                at.at(("endpoints", place_.endpoint), key=True),
            )
    for derived in registry.routes():
        loop = None if derived.publish else _loop(config, derived)
        if loop is not None:
            raise ConfigError(
                f"endpoint {derived.endpoint!r}, its proxy on {derived.from_.connection!r}: {loop}",
                at.at(("endpoints", derived.endpoint), key=True),
            )
    if config.proxies.error_queue:
        for connection in registry.proxy_connections:
            kind = config.connections[connection].type
            where = at.at(("proxies", "error_queue"))
            address_name(
                kind, config.proxies.error_queue, f"proxies.error_queue on {connection!r}", where
            )
    _error_queues(config, at)
    lint_pubsub.subscriptions(config, registry, at)
    _routes_against_registry(config, registry, at)


def _error_queues(config: BridgeConfig, at: Positions) -> None:
    """No error queue may be named like an endpoint: the endpoint would receive poison."""
    folded = {name.casefold(): name for name in config.endpoints}
    queues: list[tuple[str, tuple[str | int, ...] | None]] = [
        (config.proxies.error_queue or DEFAULT_ERROR_QUEUE, ("proxies", "error_queue"))
    ]
    for i, route in enumerate(config.routes):
        queues.append((route.error_queue_name, ("routes", i, "error_queue")))
    for queue, path in queues:
        endpoint = folded.get(queue.casefold())
        if endpoint is not None:
            written = path is not None and path in at.values
            raise ConfigError(
                f"error queue {queue!r} is named like endpoint {endpoint!r}: messages the bridge "
                "cannot forward would be delivered to the endpoint; name another error queue",
                at.at(path) if written and path else at.at(("endpoints", endpoint), key=True),
            )


def _routes_against_registry(config: BridgeConfig, registry: Registry, at: Positions) -> None:
    """A written route must not do what a derived one does, nor take its name; two derived
    routes cannot share a name (`proxy.a.b.c`: connection `a.b`, endpoint `c`, or `a`, `b.c`)."""
    derived: dict[str, DerivedRoute] = {}
    for made in registry.routes():
        other = derived.setdefault(made.name, made)
        if other is not made:
            raise ConfigError(
                f"endpoint {made.endpoint!r}: its route from {made.from_.connection!r} would "
                f"be named {made.name!r}, as endpoint {other.endpoint!r}'s from "
                f"{other.from_.connection!r}; rename the endpoint or the connection",
                at.at(("endpoints", made.endpoint), key=True),
            )
    sources = {(r.from_.connection, r.from_.address): r for r in derived.values()}
    for i, route in enumerate(config.routes):
        if route.name in derived:
            raise ConfigError(
                f"route name {route.name!r} is the name of a route the registry derives",
                at.at(("routes", i, "name")),
            )
        same = sources.get((route.from_.connection, route.from_.address))
        if same is not None:
            raise ConfigError(
                f"route {route.name!r} reads {route.from_.address!r} on "
                f"{route.from_.connection!r}, the proxy of endpoint {same.endpoint!r}, which "
                f"route {same.name!r} (derived from the registry) already forwards",
                at.at(("routes", i, "from")),
            )


#: Connection types NServiceBus endpoints send and reply on. Kafka is not one: no NServiceBus
#: endpoint replies to a Kafka topic.
_NSERVICEBUS_TYPES = ("sqlserver", "postgresql", "sqlite", "rabbitmq")


def registry_warnings(config: BridgeConfig, at: Positions) -> list[str]:
    """A registry that works but where messages could not go where users expect."""
    if not config.endpoints:
        return []
    registry = config.registry
    out = []
    homes = {e.connection for e in config.endpoints.values()}
    for connection in sorted(homes - set(registry.proxy_connections)):
        out.append(
            f"{at.at(('proxies', 'connections'))}: warning: connection {connection!r} hosts "
            "endpoints but no proxies: its endpoints can receive from the other connections, "
            "but cannot send to them, and replies to them are refused"
        )
    if config.proxies.connections is None:
        for connection in config.connections:
            if connection not in homes:
                out.append(
                    f"{at.at(('connections', connection), key=True)}: warning: connection "
                    f"{connection!r} hosts no endpoint, yet gets a proxy and a route for every "
                    "endpoint; list the connections that take part in `proxies: connections`"
                )
    return out


def connection_warnings(config: BridgeConfig, at: Positions) -> list[str]:
    """Connection settings that work but that a transport's `warnings` advises against."""
    out = []
    for name, connection in config.connections.items():
        advise = getattr(RULES[connection.type], "warnings", None)
        for key, problem in advise(connection) if advise is not None else ():
            path: tuple[str | int, ...] = ("connections", name, *key.split("."))
            out.append(f"{at.at(path)}: warning: connection {name!r}: {problem}")
    return out


def route_warnings(config: BridgeConfig, at: Positions) -> list[str]:
    """Routes that work but whose replies may not: a written route between two NServiceBus
    transports with no address map carries reply addresses the other side cannot reach."""
    out = []
    for i, route in enumerate(config.routes):
        source = config.connections[route.from_.connection].type
        destination = config.connections[route.to.connection].type
        crosses = source != destination and {source, destination} <= set(_NSERVICEBUS_TYPES)
        if crosses and not route.address_map:
            out.append(
                f"{at.at(('routes', i, 'name'))}: warning: route {route.name!r} crosses from "
                f"{source} to {destination} with no address_map: NServiceBus.ReplyToAddress "
                f"values written on {route.from_.connection!r} are not addresses on "
                f"{route.to.connection!r}; register the endpoints under `endpoints:` or map "
                "them in `address_map`"
            )
    return out
