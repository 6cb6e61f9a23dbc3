"""Header rules of a route, applied between source and sink.

Order: the address map (NServiceBus.ReplyToAddress, NServiceBus.FailedQ on error copies and
ServiceControl.Retry.AcknowledgementQueue on retried messages, as the Messaging Bridge does),
then rename, drop, set. An address missing from the map passes
unchanged. Everything else about the message crosses untouched.
"""

from __future__ import annotations

from bridge.config.models import Route
from bridge.envelope import Envelope

__all__ = ["ADDRESS_HEADERS", "RouteRules"]

ADDRESS_HEADERS = (
    "NServiceBus.ReplyToAddress",
    "NServiceBus.FailedQ",
    "ServiceControl.Retry.AcknowledgementQueue",
)


class RouteRules:
    """A route's header rules as a function of an envelope; `identity` when there are none."""

    def __init__(self, route: Route) -> None:
        self._address_map = dict(route.address_map)
        self._rename = dict(route.headers.rename)
        self._drop = list(route.headers.drop)
        self._set = dict(route.headers.set)
        self.identity = not (self._address_map or self._rename or self._drop or self._set)

    def __call__(self, envelope: Envelope) -> Envelope:
        if self.identity:
            return envelope
        headers = envelope.headers.copy()
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
        return Envelope(headers, envelope.body, envelope.expires_at, envelope.native_id)
