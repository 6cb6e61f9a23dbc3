"""The registry's events: who subscribes to what, where the bridge subscribes on their behalf,
and the routes that carry events across (messaging-bridge.md §2).

For a subscriber S (living on connection H) of event E whose publisher lives on connection C:

- H is C: S subscribes itself, natively; the bridge does nothing (`local`).
- C holds SQL queue tables or RabbitMQ and H is not Kafka: S's proxy on C subscribes natively,
  as the Messaging Bridge's proxies do (`proxy`): a SubscriptionRouting row (Endpoint S,
  QueueAddress the proxy's address on C, Topic E), or E's exchange bound to the proxy's.
  What is published reaches the proxy, whose route forwards it like any message.
- C holds SQL queue tables or RabbitMQ and H is Kafka (`kafka`): an event goes to Kafka once, to
  the topic of its type, never once per subscriber. So every Kafka subscriber of E on H is
  subscribed with one address, an *event queue* of (H, E) on C (`event_tables.py`, named from
  H and E alone, so the file's order names nothing): on SQL one SubscriptionRouting row per
  subscriber, all with the event queue's QueueAddress, which a publisher's `SELECT DISTINCT
  QueueAddress` reads as one; on RabbitMQ E's exchange bound once to the event queue's. One
  route per event queue (`events.<C>.<queue>`, `EventTableRoute`) reads it and sends each
  event once to E's topic on H. A Kafka endpoint's proxy on C carries only what is sent to it.
- C is Kafka and H is not (`home`): the publisher produces E to E's topic. One route per
  (E, H), `publish.<H>.<topic>`, reads the topic in its own consumer group and publishes each
  event on H as an NServiceBus publisher does; S is subscribed on H as it would subscribe itself
  (a row with its own address, or E's exchange bound to its own), so that the publish finds it.

On a connection of NGinn tables (`layout: nginn`) a subscription is a row of NGinn's
subscription table instead (`nginn_row`): publisher endpoint, subscriber endpoint, message type.
For `proxy` and `kafka` there (an NGinn publisher), the subscriber endpoint is not the proxy
but an *event table* of the subscription (`event_tables.py`): NGinn's Notify writes rows just
as its Send does, so only a table no one sends to says that a row is an event, and of which
subscription. One route per event table (`events.<connection>.<table>`, `EventTableRoute`)
reads it and sends each row, marked published as the subscribed event, to the subscriber's
queue (`proxy`), or once to the event's topic (`kafka`: one table per Kafka connection and
event, like the event queues above); the proxy's own route then carries only what is sent to
the endpoint. (`queue` of a Kafka subscriber of an NGinn publisher is the proxy on C of the
first Kafka subscriber of E on H in the file: the row a bridge from before event tables wrote
names it, and unsubscribing removes that row too.)

An event table or queue must exist before it is subscribed (`bridge install` creates them as
it creates proxies, with `proxies: {create: true}`): a row or binding naming a missing one
would make the publisher fail (NGinn) or lose the events (SQL, RabbitMQ).

Driver-free, like the registry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Literal

from bridge.config.event_tables import Wanted, event_table_route, event_tables
from bridge.config.kinds import RULES
from bridge.config.models import DerivedRoute, EventRoute, EventTableRoute
from bridge.nservicebus.events import kafka_topic
from bridge.transports.rabbitmq.config import RABBITMQ_MAX_NAME_BYTES
from bridge.transports.sql.config import (
    MAX_TABLE_NAME_BYTES,
    NGINN_ENDPOINT_CHARS,
    SQLSERVER_MAX_NAME,
    NGinnOptions,
)

if TYPE_CHECKING:
    from bridge.config.registry import Registry

__all__ = ["PubSub", "Subscribed", "event_route_name", "event_table_route"]

Kind = Literal["local", "proxy", "kafka", "home"]
#: Connection types whose native pub/sub the bridge writes (SubscriptionRouting, exchanges).
NATIVE = ("sqlserver", "postgresql", "sqlite", "rabbitmq")


def event_route_name(connection: str, topic: str) -> str:
    return f"publish.{connection}.{topic}"


@dataclass(frozen=True)
class Subscribed:
    """One `subscribes:` entry, resolved: where the bridge subscribes, with which address."""

    endpoint: str
    event: str
    publisher: str
    kind: Kind
    #: The connection the native subscription is made on (none for `local`).
    connection: str
    #: The queue the subscription delivers to there (a proxy, or the endpoint's own queue),
    #: and its address as NServiceBus writes it (SubscriptionRouting's QueueAddress); for an
    #: NGinn publisher, the endpoint of the event table, which delivers to `queue`.
    queue: str
    address: str
    #: For an NGinn publisher (`proxy` and `kafka` on NGinn tables): the subscription's event
    #: table on `connection`; for `kafka` on SQL queue tables or RabbitMQ: its event queue
    #: there (also `queue`). None when none fits: `bridge check` refuses that.
    table: str | None = None

    @property
    def native(self) -> bool:
        return self.kind != "local"


class PubSub:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        config = registry.config
        self.topics = {name: event.topic for name, event in config.events.items() if event.topic}

    def _type(self, connection: str) -> str:
        return self.registry.config.connections[connection].type

    def topic(self, event: str) -> str:
        return kafka_topic(event, self.topics)

    def publisher_of(self, event: str) -> str | None:
        for endpoint in self.registry.endpoints.values():
            for subscription in endpoint.subscribes:
                if subscription.event == event:
                    return subscription.publisher
        return None

    def subscriptions(self) -> Iterator[Subscribed]:
        """Every `subscribes:` entry whose publisher is registered, in the file's order."""
        return iter(self._made)

    @cached_property
    def _made(self) -> list[Subscribed]:
        return self._with_event_tables(list(self._resolved()))

    def _resolved(self) -> Iterator[Subscribed]:
        registry = self.registry
        # For an NGinn publisher only (`proxy_endpoint` in service/subscription_state.py): the
        # proxy of the first Kafka subscriber, which a bridge from before event tables
        # subscribed; elsewhere `_with_event_tables` gives each its event queue.
        carriers: dict[tuple[str, str], str] = {}
        for name, endpoint in registry.endpoints.items():
            home = endpoint.connection
            for subscription in endpoint.subscribes:
                event, publisher = subscription.event, subscription.publisher
                if publisher not in registry.endpoints:
                    continue
                on = registry.home(publisher)
                if on == home:
                    yield Subscribed(name, event, publisher, "local", on, name, "")
                elif self._type(on) == "kafka":
                    queue = registry.queue(name, home)
                    address = registry.address(name, home)
                    yield Subscribed(name, event, publisher, "home", home, queue, address)
                elif self._type(home) == "kafka":
                    carrier = carriers.setdefault((event, home), name)
                    address = registry.address(carrier, on)
                    yield Subscribed(name, event, publisher, "kafka", on, carrier, address)
                else:
                    yield Subscribed(
                        name, event, publisher, "proxy", on, name, registry.address(name, on)
                    )

    def nginn(self, connection: str) -> NGinnOptions | None:
        """`connection`'s `nginn:` options when it holds NGinn tables, else None."""
        model = self.registry.config.connections[connection]
        options = getattr(model, "nginn", None)
        layout = getattr(model, "layout", None)
        return options if isinstance(options, NGinnOptions) and layout == "nginn" else None

    def _with_event_tables(self, made: list[Subscribed]) -> list[Subscribed]:
        """`made`, each subscription to an NGinn publisher given its event table: one per
        connection, subscriber queue and event; the Kafka subscribers of an event on one Kafka
        connection share one, owned by that connection (not the first of them, which moves with
        the file's order); so do those of an event published on SQL queue tables or RabbitMQ,
        whose one event queue is named the same way. Named on each connection all at once
        (`event_tables`), so that the order of the file names nothing."""
        wanted: dict[Subscribed, Wanted] = {}
        for s in made:
            nginn = self.nginn(s.connection) is not None
            if (s.kind in ("proxy", "kafka") and nginn) or s.kind == "kafka":
                wanted[s] = self._owner(s)
        named: dict[tuple[str, Wanted], str | None] = {}
        for connection in dict.fromkeys(s.connection for s in wanted):
            here = {w for s, w in wanted.items() if s.connection == connection}
            found = event_tables(here, self._room(connection), self._taken(connection))
            named.update({(connection, w): table for w, table in found.items()})
        out = []
        for s in made:
            if s not in wanted:
                out.append(s)
                continue
            table = named[s.connection, wanted[s]]
            address = s.address if table is None else self._endpoint(s.connection, table)
            queue = s.queue if table is None or self.nginn(s.connection) else table
            out.append(dataclasses.replace(s, table=table, address=address, queue=queue))
        return out

    def _room(self, connection: str) -> int:
        """The longest event table or queue name `connection` takes: what NGinn's
        `to_endpoint` leaves after `sql://<alias>/`, else the transport's limit on a queue's
        name (`names.address_name`: PostgreSQL's table, which leaves room for `.Delayed`, SQL
        Server's identifier less its delayed table's suffix, AMQP's shortstr; all ASCII, as
        `event_tables` names with `[A-Za-z0-9_]` only)."""
        kind = self._type(connection)
        if self.nginn(connection) is not None:
            return NGINN_ENDPOINT_CHARS - len(self._endpoint(connection, ""))
        if kind == "postgresql":
            return MAX_TABLE_NAME_BYTES
        if kind == "rabbitmq":
            return RABBITMQ_MAX_NAME_BYTES
        # SQL Server's identifier (SQLite takes any), less what names its delayed table, which
        # `bridge install` creates beside it (`<queue>.<delayed_suffix>`).
        suffix = getattr(self.registry.config.connections[connection], "delayed_suffix", "")
        return SQLSERVER_MAX_NAME - len(f".{suffix}")

    def _owner(self, s: Subscribed) -> Wanted:
        """Whose event table `s` reads, as (owner, seed, event): the subscriber's queue, or
        for a Kafka subscriber its Kafka connection (seeded apart from any queue's name)."""
        if s.kind == "kafka":
            home = self.registry.home(s.endpoint)
            return home, f"kafka:{home}", s.event
        return s.queue, s.queue, s.event

    def _endpoint(self, connection: str, table: str) -> str:
        model = self.registry.config.connections[connection]
        return str(RULES[model.type].canonical_address(model, table))

    def _taken(self, connection: str) -> set[str]:
        """The tables on `connection` an event table must not be: the endpoints' queues and
        proxies, NGinn's subscription table, the routes' ends and the proxies' error queue."""
        config = self.registry.config
        names = {p.queue for p in self.registry.places() if p.connection == connection}
        options = self.nginn(connection)
        if options is not None:
            names.add(options.subscriptions)
        table = getattr(config.connections[connection], "subscription_table", None)
        if isinstance(table, str) and self._type(connection) != "rabbitmq":
            names.add(table)  # SubscriptionRouting
        if config.proxies.error_queue:
            names.add(config.proxies.error_queue)
        for route in config.routes:
            for end in (route.from_, route.to):
                if end.connection == connection and end.queue:
                    names.add(end.queue)
            if route.from_.connection == connection and route.error_queue:
                names.add(route.error_queue)
        return {name.casefold() for name in names}

    def nginn_row(self, s: Subscribed) -> tuple[str, str, str] | None:
        """(publisher_endpoint, subscriber_endpoint, message_type) of `s` in NGinn's
        subscription table where `s` is made on a connection of NGinn tables (else None): the
        publisher's endpoint there (its own table's, or for an event published on Kafka its
        proxy's), the subscribing table's (for an NGinn publisher the subscription's event
        table, for an event published on Kafka the subscriber's own), the event's NGinn name
        (`nginn.types`)."""
        options = self.nginn(s.connection)
        if not s.native or options is None:
            return None
        publisher = self.registry.address(s.publisher, s.connection)
        return publisher, s.address, options.message_type(s.event)

    def native(self) -> list[Subscribed]:
        """The subscriptions the bridge makes, by connection then in the file's order."""
        made = [s for s in self.subscriptions() if s.native]
        return sorted(made, key=lambda s: s.connection)

    def event_topics(self) -> dict[str, list[str]]:
        """Kafka connection -> the event topics the bridge produces to."""
        out: dict[str, list[str]] = {}
        for s in self.subscriptions():
            if s.kind == "kafka":
                home = self.registry.home(s.endpoint)
                bucket = out.setdefault(home, [])
                if self.topic(s.event) not in bucket:
                    bucket.append(self.topic(s.event))
        return out

    def routes(self) -> list[DerivedRoute]:
        """One route per (event published on Kafka, connection of a subscriber); then one per
        event table or queue."""
        return [*self._published_routes(), *self._event_table_routes()]

    def _event_table_routes(self) -> list[EventTableRoute]:
        registry = self.registry
        proxies = registry.config.proxies
        readers: dict[str, list[Subscribed]] = {}
        for s in self.subscriptions():
            if s.table is not None:
                readers.setdefault(event_table_route(s.connection, s.table), []).append(s)
        out = []
        for name, sharing in readers.items():
            s = sharing[0]
            assert s.table is not None
            home = registry.home(s.endpoint)
            if s.kind == "kafka":
                # The Kafka subscribers' one route: named for the first of them by name, not
                # in the file, and sized as proxies are, so that the file's order changes
                # nothing.
                endpoint = min(x.endpoint for x in sharing)
                to = {"connection": home, "topic": self.topic(s.event)}
                batch_size, concurrency = proxies.batch_size, proxies.concurrency
            else:
                endpoint = s.queue
                key = RULES[self._type(home)].ADDRESS_KEY
                to = {"connection": home, key: registry.queue(s.endpoint, home)}
                own = registry.endpoints[s.queue]
                batch_size = own.batch_size or proxies.batch_size
                concurrency = own.concurrency or proxies.concurrency
            source = RULES[self._type(s.connection)].ADDRESS_KEY
            out.append(
                EventTableRoute.model_validate(
                    {
                        "name": name,
                        "endpoint": endpoint,
                        "event": s.event,
                        "from": {"connection": s.connection, source: s.table},
                        "to": to,
                        "batch_size": batch_size,
                        "concurrency": concurrency,
                        "error_queue": proxies.error_queue,
                    }
                )
            )
        return out

    def _published_routes(self) -> list[EventRoute]:
        registry = self.registry
        proxies = registry.config.proxies
        out: dict[str, EventRoute] = {}
        for s in self.subscriptions():
            if s.kind != "home":
                continue
            topic = self.topic(s.event)
            name = event_route_name(s.connection, topic)
            if name in out:
                continue
            kafka = registry.home(s.publisher)
            destination = RULES[self._type(s.connection)].ADDRESS_KEY
            out[name] = EventRoute.model_validate(
                {
                    "name": name,
                    "endpoint": s.publisher,
                    "event": s.event,
                    "from": {
                        "connection": kafka,
                        "topic": topic,
                        "group": f"{proxies.group}.{name}",
                    },
                    "to": {"connection": s.connection, destination: s.event},
                    "batch_size": proxies.batch_size,
                    "concurrency": proxies.concurrency,
                    "error_queue": proxies.error_queue,
                    "publish": True,
                }
            )
        return list(out.values())
