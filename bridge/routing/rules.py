"""Header rules of a route, applied between source and sink.

A route written in routes.yaml: its address map (NServiceBus.ReplyToAddress, NServiceBus.FailedQ
and ServiceControl.Retry.AcknowledgementQueue; not on an audit copy, whose addresses are
history), then rename, drop, set. An address missing from the map passes unchanged.

A route the registry derives translates addresses as the Messaging Bridge does
(MessageShovel.cs:24-75 of Particular/NServiceBus.MessagingBridge@ef463cf), through the
registry, which knows every endpoint's address on every connection:

- an error copy (it carries `NServiceBus.FailedQ`): FailedQ must translate; the reply address
  translates when it is a registered endpoint's, so that a retry's replies arrive;
- an audit copy (`NServiceBus.ProcessingEnded`): nothing changes;
- a ServiceControl retry (`ServiceControl.Retry.UniqueMessageId`): the acknowledgement queue must
  translate, the reply address when it can;
- any other message gets `NServiceBus.Bridge.Transfer = <from>-><to>` (connection names) and its
  reply address must translate.

A route of an event table or event queue (`EventTableRoute`: an NGinn publisher's, or the Kafka
subscribers' of an event published on SQL or RabbitMQ) reads only what was published for one
subscription: each message becomes that event published (`mark_published`: intent `Publish`,
the event listed in `NServiceBus.EnclosedMessageTypes` when it is not), before the runner counts
it, so `/routes` and the metrics count it as published.

An address that must translate and names no registered endpoint raises `UnknownAddress`: the
message goes to the route's error queue with a reason naming the nearest endpoint, never onward
with an address the other side cannot reach. `NServiceBus.MessagingBridge.FailedQ` (the
Messaging Bridge's own failure marker) is removed, as the Messaging Bridge removes it.

Everything else about the message crosses untouched.
"""

from __future__ import annotations

from bridge.config.models import DerivedRoute, EventTableRoute, Route
from bridge.config.registry import Registry, UnknownAddress
from bridge.envelope import Envelope, Headers
from bridge.nservicebus.events import mark_published
from bridge.nservicebus.lifetime import FAILED_Q, PROCESSING_ENDED

__all__ = ["ADDRESS_HEADERS", "TRANSFER", "RouteRules"]

REPLY_TO = "NServiceBus.ReplyToAddress"
RETRY_ACK = "ServiceControl.Retry.AcknowledgementQueue"
ADDRESS_HEADERS = (REPLY_TO, FAILED_Q, RETRY_ACK)
TRANSFER = "NServiceBus.Bridge.Transfer"
RETRY_ID = "ServiceControl.Retry.UniqueMessageId"
BRIDGE_FAILED_Q = "NServiceBus.MessagingBridge.FailedQ"


class RouteRules:
    """A route's header rules as a function of an envelope; `identity` when there are none."""

    def __init__(self, route: Route, registry: Registry | None = None) -> None:
        self._address_map = dict(route.address_map)
        self._rename = dict(route.headers.rename)
        self._drop = list(route.headers.drop)
        self._set = dict(route.headers.set)
        self._registry = registry if isinstance(route, DerivedRoute) else None
        self._source = route.from_.connection
        self._destination = route.to.connection
        self._transfer = f"{self._source}->{self._destination}"
        self._event = route.event if isinstance(route, EventTableRoute) else None
        self.identity = self._registry is None and not (
            self._address_map or self._rename or self._drop or self._set or self._event
        )

    def __call__(self, envelope: Envelope) -> Envelope:
        """The envelope to send; raises `UnknownAddress` for one that must not be forwarded."""
        if self.identity:
            return envelope
        headers = envelope.headers.copy()
        if self._event is not None:
            mark_published(headers, self._event)
        if self._registry is not None:
            self._translate(headers)
        if PROCESSING_ENDED not in headers:  # an audit copy's addresses stay as they were
            for name in ADDRESS_HEADERS:
                value = headers.get(name)
                if value is not None and value in self._address_map:
                    headers.set(name, self._address_map[value])
        for old, new in self._rename.items():
            headers.rename(old, new)
        for name in self._drop:
            headers.remove(name)
        for name, value in self._set.items():
            headers.set(name, value)
        return envelope.with_headers(headers)

    def _translate(self, headers: Headers) -> None:
        headers.remove(BRIDGE_FAILED_Q)
        if FAILED_Q in headers:
            self._address(headers, FAILED_Q, strict=True)
            self._address(headers, REPLY_TO, strict=False)
        elif PROCESSING_ENDED in headers:
            return
        elif RETRY_ID in headers:
            self._address(headers, RETRY_ACK, strict=True)
            self._address(headers, REPLY_TO, strict=False)
        else:
            headers.set(TRANSFER, self._transfer)
            self._address(headers, REPLY_TO, strict=True)

    def _address(self, headers: Headers, name: str, *, strict: bool) -> None:
        value = headers.get(name)
        if not value or self._registry is None:
            return
        try:
            translated = self._registry.translate(value, self._source, self._destination, name)
        except UnknownAddress:
            if strict:
                raise
            return
        headers.set(name, translated)
