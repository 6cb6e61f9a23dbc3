"""Events on RabbitMQ as NServiceBus RabbitMQ's conventional topology lays them out.

Facts (Particular/NServiceBus.RabbitMQ@ec745bf8, src/NServiceBus.Transport.RabbitMQ/Routing/
ConventionalRoutingTopology.cs):

- every event type has a durable fanout exchange named `Namespace:Name` (:19, :127-141);
- subscribing declares the subscribed type's exchange and its base types' (SetupTypeSubscriptions,
  :93-121: each type's exchange bound to its base's, `exchange.bind destination=<base>
  source=<derived>`), then binds the type's exchange to the subscriber's own exchange, named
  like its queue, with routing key "" (:29-36); a subscription to `NServiceBus.IEvent` is one
  to `System.Object` (:32); unsubscribing unbinds the subscriber's exchange (:38-52);
- publishing sets up the event type's exchanges the same way and publishes to its exchange
  with `mandatory=false` (:54-58): an event nobody subscribes to is dropped.

The Messaging Bridge subscribes with a type it makes at run time from the event's name, a class
with no base but `System.Object` and no interfaces (RuntimeTypeGenerator.cs:57-81 of
Particular/NServiceBus.MessagingBridge@ef463cf, subscribed through the transport:
SubscriptionManager.cs:37-49): so a subscription declares the event's exchange, binds it to
`System:Object`'s, and binds it to the subscriber's.

A publisher without .NET types (the bridge, for events read from Kafka) knows the hierarchy only
from `NServiceBus.EnclosedMessageTypes`, most derived first: it binds each listed type's exchange
to the next one's, the last to `System:Object`'s (Derived -> Base -> System:Object), as
SetupTypeSubscriptions chains a class to its bases.

`Declaration`s (`delays.py`) are run by `admin.run_declaration`, on the link of the caller.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from urllib.parse import quote

from bridge.envelope import Envelope
from bridge.errors import TransportUnavailable
from bridge.nservicebus.delays import refuse_delays
from bridge.nservicebus.events import OBJECT, exchange_name, published, topics_of
from bridge.protocols import Checkpoint
from bridge.transports.rabbitmq.admin import run_declaration
from bridge.transports.rabbitmq.config import RabbitMQConnection, describe
from bridge.transports.rabbitmq.connection import link
from bridge.transports.rabbitmq.delays import Declaration
from bridge.transports.rabbitmq.management import curl, endpoint
from bridge.transports.rabbitmq.sink import encode_batch

__all__ = [
    "RabbitMQPublisher",
    "printed",
    "publish_declarations",
    "subscribe",
    "subscribed_type",
    "unsubscribe",
]

IEVENT = "NServiceBus.IEvent"


def _exchange(event: str) -> Declaration:
    return Declaration("exchange", exchange_name(event), exchange_type="fanout")


def subscribed_type(event: str) -> str:
    """The type whose exchange a subscription to `event` binds."""
    return OBJECT if event == IEVENT else event


def _bound(derived: str, base: str) -> Declaration:
    """`derived`'s exchange bound to `base`'s: what is published as `derived` reaches `base`'s."""
    return Declaration("exchange_bind", exchange_name(base), source=exchange_name(derived))


def subscribe(event: str, queue: str) -> list[Declaration]:
    """What subscribing `queue` (its exchange) to `event` declares, in NServiceBus's order:
    the event's exchange bound to `System:Object`'s (the Messaging Bridge's type of the event
    derives from nothing else), then to the subscriber's."""
    event = subscribed_type(event)
    base = [] if event == OBJECT else [_exchange(OBJECT), _bound(event, OBJECT)]
    return [
        _exchange(event),
        *base,
        Declaration("exchange_bind", queue, source=exchange_name(event)),
    ]


def unsubscribe(event: str, queue: str) -> list[Declaration]:
    return [Declaration("exchange_unbind", queue, source=exchange_name(subscribed_type(event)))]


def publish_declarations(types: Sequence[str]) -> list[Declaration]:
    """The exchanges of an event's `types` (most derived first, `System.Object` last:
    `topics_of`), each bound to the next one's."""
    out = [_exchange(types[0])]
    for derived, base in itertools.pairwise(types):
        out += [_exchange(base), _bound(derived, base)]
    return out


def printed(config: RabbitMQConnection, declarations: Sequence[Declaration]) -> list[str]:
    """`declarations` (exchanges and exchange bindings) as the management API's requests, for
    `install --print-sql` (`management.curl`)."""
    api = endpoint(config)
    out = []
    for d in declarations:
        if d.kind == "exchange":
            body = {"type": d.exchange_type, "durable": True, "auto_delete": False}
            out.append(curl(api, "PUT", f"api/exchanges/{{vhost}}/{quote(d.name, safe='')}", body))
        elif d.kind == "exchange_bind":
            source, destination = quote(d.source, safe=""), quote(d.name, safe="")
            path = f"api/bindings/{{vhost}}/e/{source}/e/{destination}"
            out.append(curl(api, "POST", path, {"routing_key": d.routing_key, "arguments": {}}))
    return out


class RabbitMQPublisher:
    """A sink that publishes each event to its type's exchange, declaring the exchanges and
    bindings of each type hierarchy once per publisher; returns once the broker confirmed
    every message (an event no queue takes is confirmed and dropped, as NServiceBus's is). An
    event to be delivered later raises `MessageRejected`: NServiceBus does not delay a publish."""

    def __init__(self, config: RabbitMQConnection, name: str, event: str | None = None) -> None:
        #: The type of an event that names none (`published`): the one its route carries.
        self._event = event
        self._where = f"{describe(name)}, publish"
        self._link = link(config, name, "sink", self._where, confirm=True)
        self._declared: set[tuple[str, ...]] = set()

    async def send(
        self, envelopes: Sequence[Envelope], checkpoint: Checkpoint | None = None
    ) -> None:
        if not envelopes:
            return
        now = time.time()
        refuse_delays(envelopes, now, self._where)  # NServiceBus does not delay a publish
        envelopes = [published(envelope, self._event) for envelope in envelopes]
        messages, _ = encode_batch(envelopes, now, self._link.frame_max)
        routes: list[tuple[str, str] | None] = []
        for envelope in envelopes:
            types = tuple(topics_of(envelope.headers))
            if types not in self._declared:
                for declaration in publish_declarations(types):
                    await self._link.run(run_declaration(declaration), what=declaration.text)
                self._declared.add(types)
            routes.append((exchange_name(types[0]), ""))
        outcome = await self._link.publish("", "", messages, routes=routes, mandatory=False)
        if outcome.nacked:
            raise TransportUnavailable(
                f"{self._where}: the broker refused {outcome.nacked} of {len(messages)} events"
            )

    async def close(self) -> None:
        await self._link.close()
