"""The endpoint registry: where each endpoint lives, its address everywhere, the routes it needs.

As the NServiceBus Messaging Bridge does (messaging-bridge.md §1): each endpoint under
`endpoints:` lives on one connection; on every other connection that holds proxies (`proxies:
connections`, all by default) it has a proxy, a queue (a topic on Kafka) with its name. The
bridge derives one route per proxy, named `proxy.<connection>.<endpoint>`, that moves what
arrives there to the endpoint's own queue.

Knowing every endpoint's address on every connection, the registry translates address headers
(`NServiceBus.ReplyToAddress`, ...) written on one transport into the address of the same
endpoint, or its proxy, on another. An address is recognised in whatever form a transport writes
it (`Sales`, `Sales@dbo`, `Sales@[dbo]@[db]`, `"public"."Sales"`): each connection's `address_key`
reduces it to the table, schema and catalog it names.

Driver-free: `bridge check` and `bridge endpoints` use it without connecting.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from bridge.config.kinds import RULES
from bridge.config.models import BridgeConfig, DerivedRoute, Endpoint, RegisteredEndpoint
from bridge.errors import MessageRejected

if TYPE_CHECKING:
    from bridge.config.pubsub import PubSub

__all__ = ["Registry", "UnknownAddress", "route_name"]

Key = tuple[str, str | None, str | None]


def route_name(endpoint: str, connection: str) -> str:
    """The name of the route from `endpoint`'s proxy on `connection`."""
    return f"proxy.{connection}.{endpoint}"


class UnknownAddress(MessageRejected):
    """An address header that names no registered endpoint: the message cannot be delivered
    where its replies (or retries, or acknowledgements) would be reachable."""


@dataclass(frozen=True)
class Place:
    """One endpoint's queue on one connection: its own, or its proxy."""

    endpoint: str
    connection: str
    queue: str
    address: str
    proxy: bool


class Registry:
    def __init__(self, config: BridgeConfig) -> None:
        self.config = config
        self.endpoints: dict[str, RegisteredEndpoint] = dict(config.endpoints)
        listed = config.proxies.connections
        self.proxy_connections: list[str] = list(
            listed if listed is not None else config.connections
        )
        # connection -> its address keys -> endpoint
        self._index: dict[str, dict[Key, str]] = {}
        for place in self.places():
            key = self._key(place.connection, place.address)
            self._index.setdefault(place.connection, {})[key] = place.endpoint

    def __bool__(self) -> bool:
        return bool(self.endpoints)

    @cached_property
    def pubsub(self) -> PubSub:
        """Subscriptions and the routes of events (`pubsub.py`)."""
        from bridge.config.pubsub import PubSub

        return PubSub(self)

    # -- where everything is ----------------------------------------------------------------------

    def home(self, endpoint: str) -> str:
        return self.endpoints[endpoint].connection

    def queue(self, endpoint: str, connection: str) -> str:
        """The name of `endpoint`'s queue on `connection`: its own there, else its proxy's."""
        registered = self.endpoints[endpoint]
        if connection == registered.connection and registered.queue:
            return registered.queue
        return endpoint

    def address(self, endpoint: str, connection: str) -> str:
        """`endpoint`'s address on `connection`, as NServiceBus writes it in headers there."""
        config = self.config.connections[connection]
        return str(RULES[config.type].canonical_address(config, self.queue(endpoint, connection)))

    def collisions(self) -> Iterator[tuple[Place, Place]]:
        """Pairs of places that are one queue: an endpoint's own queue that is another's proxy,
        or two endpoints' own queues."""
        seen: dict[tuple[str, Key], Place] = {}
        for place in self.places():
            key = (place.connection, self._key(place.connection, place.address))
            if key in seen:
                yield seen[key], place
            else:
                seen[key] = place

    def connections(self) -> list[str]:
        """Every connection the registry uses: the proxies' and the endpoints' own."""
        homes = [e.connection for e in self.endpoints.values()]
        return list(dict.fromkeys([*self.proxy_connections, *homes]))

    def places(self) -> Iterator[Place]:
        """Each endpoint's queue on each connection the registry uses, its own first."""
        for name, endpoint in self.endpoints.items():
            home = endpoint.connection
            yield Place(name, home, self.queue(name, home), self.address(name, home), False)
            for connection in self.proxy_connections:
                if connection != home:
                    yield Place(name, connection, name, self.address(name, connection), proxy=True)

    def proxies(self) -> Iterator[Place]:
        return (place for place in self.places() if place.proxy)

    def routes(self) -> list[DerivedRoute]:
        """One route per proxy, into the endpoint's own queue; then the routes of events
        published on Kafka and of NGinn event tables (`pubsub.py`)."""
        proxies = self.config.proxies
        out = []
        for place in self.proxies():
            endpoint = self.endpoints[place.endpoint]
            home = endpoint.connection
            source_kind = self.config.connections[place.connection].type
            group = f"{proxies.group}.{place.endpoint}" if RULES[source_kind].SOURCE_GROUP else None
            out.append(
                DerivedRoute.model_validate(
                    {
                        "name": route_name(place.endpoint, place.connection),
                        "endpoint": place.endpoint,
                        "from": self._end(place.connection, place.queue, group),
                        "to": self._end(home, self.queue(place.endpoint, home)),
                        "batch_size": endpoint.batch_size or proxies.batch_size,
                        "concurrency": endpoint.concurrency or proxies.concurrency,
                        "error_queue": proxies.error_queue,
                    }
                )
            )
        return [*out, *self.pubsub.routes()]

    def _end(self, connection: str, name: str, group: str | None = None) -> Endpoint:
        kind = self.config.connections[connection].type
        key = RULES[kind].ADDRESS_KEY
        return Endpoint(connection=connection, group=group, **{key: name})

    # -- translation ------------------------------------------------------------------------------

    def _key(self, connection: str, address: str) -> Key:
        config = self.config.connections[connection]
        key: Key = RULES[config.type].address_key(config, address)
        return key

    def find(self, address: str, read_on: str) -> str | None:
        """The endpoint whose address (own or proxy) `address` is: read as the transport of
        `read_on` writes addresses first, then as every other connection's."""
        order = [read_on, *(c for c in self._index if c != read_on)]
        for connection in order:
            index = self._index.get(connection)
            if not index:
                continue
            found = index.get(self._key(connection, address))
            if found is not None:
                return found
        return None

    def has_place(self, endpoint: str, connection: str) -> bool:
        """Whether `endpoint` has a queue on `connection`: its own, or a proxy."""
        return connection == self.home(endpoint) or connection in self.proxy_connections

    def translate(self, address: str, read_on: str, to: str, header: str) -> str:
        """`address`, read on connection `read_on`, as the same endpoint's address on `to`."""
        endpoint = self.find(address, read_on)
        if endpoint is None:
            raise UnknownAddress(
                f"{header} {address!r} is not the address of a registered endpoint "
                f"({self.nearest(address, read_on)}), so it has no address on {to!r}"
            )
        if not self.has_place(endpoint, to):
            raise UnknownAddress(
                f"{header} {address!r} is endpoint {endpoint!r}, which has no proxy on {to!r} "
                f"(`proxies: connections` leaves {to!r} out), so it could not be reached from there"
            )
        return self.address(endpoint, to)

    def nearest(self, address: str, read_on: str) -> str:
        """A hint naming the registered endpoint closest to `address`."""
        if not self.endpoints:
            return "no endpoints are registered"
        config = self.config.connections[read_on]
        table = str(RULES[config.type].address_key(config, address)[0])
        names = list(self.endpoints)
        if table in self.endpoints:
            return (
                f"nearest: {table!r}, whose address on {read_on!r} is "
                f"{self.address(table, read_on)!r}: another schema or database"
            )
        same_but_case = [n for n in names if n.lower() == table.lower()]
        if same_but_case:
            return f"nearest: {same_but_case[0]!r}, which differs only in case"
        close = difflib.get_close_matches(table, names, n=1, cutoff=0.0)
        return f"nearest: {close[0]!r}" if close else "no endpoint is close"
