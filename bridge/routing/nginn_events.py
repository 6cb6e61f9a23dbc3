"""An NGinn publisher's events, recognised where they reach a proxy on NGinn tables.

NGinn's `Notify` sends an event as it sends any message: one row per subscriber endpoint, with
`from_endpoint` the publisher's endpoint and no correlation id (MessageBus.cs:226-255, 347-371
of lafar6502/nginn-messagebus @1fa4baf), so the row says nothing of being published, and the
NGinn mapping reads it as intent `Send` (`nginn_rows`). The bridge wrote the subscription, so it
knows which publisher's rows of which types the proxy subscribed to: `NGinnEvents` wraps the
proxy route's sink and marks such a row published (`NServiceBus.MessageIntent = Publish`) when

- its `NServiceBus.OriginatingEndpoint` (the row's `from_endpoint`, compared ignoring case as
  NGinn compares endpoints) is a publisher the proxy subscribes to on that connection,
- it carries no `NServiceBus.CorrelationId` (Notify writes none; a reply carries its request's),
- and one of its types (`NServiceBus.EnclosedMessageTypes`, by full name or NGinn name) is one
  of the events the proxy subscribes to from that publisher; or none is, but exactly one such
  event exists: NGinn sent the row for that subscription, by a class derived from the event
  (NGinn walks the class chain, MessageBus.cs:264-287). That event is then listed after the
  row's own type in `NServiceBus.EnclosedMessageTypes`, as an NServiceBus publisher lists base
  types after the derived one, so that subscribers elsewhere find it by the subscribed name.

Everything else passes as it came: a command or a reply from the publisher, rows from others.
Behind it, a Kafka carrier's `EventTopics` produces a marked event once to its event's topic;
RabbitMQ and NServiceBus SQL subscribers get it with intent Publish.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from bridge.envelope import Envelope
from bridge.nservicebus.events import ENCLOSED_TYPES, MESSAGE_INTENT, OBJECT, PUBLISH, topics_of
from bridge.protocols import Checkpoint, Sink

__all__ = ["ORIGIN", "NGinnEvents", "Subscribed"]

ORIGIN = "NServiceBus.OriginatingEndpoint"
CORRELATION_ID = "NServiceBus.CorrelationId"


@dataclasses.dataclass(frozen=True)
class Subscribed:
    """One event a proxy subscribes to: its NServiceBus name and its NGinn name."""

    event: str
    nginn_name: str


class NGinnEvents:
    """A sink that marks an NGinn publisher's events published (see the module docstring)."""

    def __init__(self, own: Sink, events: Mapping[str, Sequence[Subscribed]]) -> None:
        self._own = own
        #: publisher endpoint, folded -> the events subscribed to from it
        self._events = {publisher.casefold(): list(subs) for publisher, subs in events.items()}

    def recognised(self, envelope: Envelope) -> Envelope:
        """`envelope`, marked published where it is one of the subscribed events."""
        headers = envelope.headers
        origin = headers.get(ORIGIN)
        subscribed = self._events.get(origin.casefold()) if origin else None
        if not subscribed or headers.get(CORRELATION_ID):
            return envelope
        types = {t for t in topics_of(headers) if t != OBJECT}
        named = [s for s in subscribed if s.event in types or s.nginn_name in types]
        if named:
            marked = headers.copy()
        elif len(subscribed) == 1:
            marked = headers.copy()
            listed = (headers.get(ENCLOSED_TYPES) or "").strip()
            event = subscribed[0].event
            marked.set(ENCLOSED_TYPES, f"{listed};{event}" if listed else event)
        else:
            return envelope
        marked.set(MESSAGE_INTENT, PUBLISH)
        return dataclasses.replace(envelope, headers=marked)

    async def send(
        self, envelopes: Sequence[Envelope], checkpoint: Checkpoint | None = None
    ) -> None:
        await self._own.send([self.recognised(e) for e in envelopes], checkpoint)

    async def close(self) -> None:
        await self._own.close()
