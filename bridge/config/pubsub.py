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
  subscribed with one address, the proxy on C of the first of them in the file (the *carrier*):
  on SQL one row per subscriber, all with the carrier's QueueAddress, which a publisher's
  `SELECT DISTINCT QueueAddress` reads as one; on RabbitMQ the carrier's one binding. The
  carrier's route sends each published event to the topics of the events it carries.
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
event, not per carrier, so that adding a Kafka subscriber above another renames nothing); the
proxy's own route then carries only what is sent to the endpoint.

The carrier of `kafka` on SQL and RabbitMQ is still the first Kafka subscriber in the file: a
proxy, which must exist for its route to carry the event. Moving it leaves, on RabbitMQ, the
old carrier's binding (README, "Subscriber on Kafka").

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
from bridge.transports.sql.config import NGINN_ENDPOINT_CHARS, NGinnOptions

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
    #: table on `connection` (None when none fits: `bridge check` refuses that).
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
        connection share one, owned by that connection (not the carrier, which moves with the
        file's order). Named on each connection all at once (`event_tables`), so that the
        order of the file names nothing."""
        wanted: dict[Subscribed, Wanted] = {}
        for s in made:
            if s.kind in ("proxy", "kafka") and self.nginn(s.connection) is not None:
                wanted[s] = self._owner(s)
        named: dict[tuple[str, Wanted], str | None] = {}
        for connection in dict.fromkeys(s.connection for s in wanted):
            here = {w for s, w in wanted.items() if s.connection == connection}
            room = NGINN_ENDPOINT_CHARS - len(self._endpoint(connection, ""))
            found = event_tables(here, room, self._taken(connection))
            named.update({(connection, w): table for w, table in found.items()})
        out = []
        for s in made:
            if s not in wanted:
                out.append(s)
                continue
            table = named[s.connection, wanted[s]]
            address = s.address if table is None else self._endpoint(s.connection, table)
            out.append(dataclasses.replace(s, table=table, address=address))
        return out

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

    def carried(self, connection: str, endpoint: str) -> list[str]:
        """The events `endpoint`'s proxy on `connection` carries to Kafka topics (none on NGinn
        tables: there an event table's route carries them)."""
        return list(
            dict.fromkeys(
                s.event
                for s in self.subscriptions()
                if s.kind == "kafka"
                and s.connection == connection
                and s.queue == endpoint
                and self.nginn(connection) is None
            )
        )

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
        NGinn event table."""
        return [*self._published_routes(), *self._event_table_routes()]

    def _event_table_routes(self) -> list[EventTableRoute]:
        registry = self.registry
        proxies = registry.config.proxies
        out: dict[str, EventTableRoute] = {}
        for s in self.subscriptions():
            if s.table is None:
                continue
            name = event_table_route(s.connection, s.table)
            if name in out:
                continue
            home = registry.home(s.endpoint)
            if s.kind == "kafka":
                to = {"connection": home, "topic": self.topic(s.event)}
            else:
                key = RULES[self._type(home)].ADDRESS_KEY
                to = {"connection": home, key: registry.queue(s.endpoint, home)}
            endpoint = registry.endpoints[s.queue]
            out[name] = EventTableRoute.model_validate(
                {
                    "name": name,
                    "endpoint": s.queue,
                    "event": s.event,
                    "from": {"connection": s.connection, "queue": s.table},
                    "to": to,
                    "batch_size": endpoint.batch_size or proxies.batch_size,
                    "concurrency": endpoint.concurrency or proxies.concurrency,
                    "error_queue": proxies.error_queue,
                }
            )
        return list(out.values())

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
