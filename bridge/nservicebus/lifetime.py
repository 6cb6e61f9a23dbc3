"""Which messages have a time to live at all (product.md, delivery semantics).

A message's lifetime is the transport's own field (SQL `Expires`, AMQP `expiration`, the Kafka
deadline header the bridge writes), never arithmetic on `NServiceBus.TimeToBeReceived`, which
travels as the endpoint wrote it. Error-queue copies (`NServiceBus.FailedQ`) and audit copies
(`NServiceBus.ProcessingEnded`) never expire: NServiceBus sends an error copy with the
original headers, TimeToBeReceived included, and no time to live, so a retry from ServicePulse
still has the header; and a copy that expired on its way to ServiceControl would be a failure
nobody sees. So a codec reads no lifetime for them (`never_expires`) and writes none
(`expires_at`, `time_to_live_ms`), whatever the message's transport field says.

What a sink writes: for a message received from a transport, what is left of its lifetime when
the sink sends it; for one the bridge originates (`Envelope.time_to_live_ms`, `bridge send`),
the time to live it was given, exactly, counted from the sink's own send, as an endpoint's
transport writes its TimeToBeReceived.
"""

from __future__ import annotations

from collections.abc import Container

from bridge.envelope import Envelope

__all__ = ["FAILED_Q", "PROCESSING_ENDED", "expires_at", "never_expires", "time_to_live_ms"]

FAILED_Q = "NServiceBus.FailedQ"
PROCESSING_ENDED = "NServiceBus.ProcessingEnded"


def never_expires(headers: Container[str]) -> bool:
    """True for an error-queue or an audit copy (`headers`: a `Headers` or a dictionary)."""
    return FAILED_Q in headers or PROCESSING_ENDED in headers


def expires_at(envelope: Envelope, now: float) -> float | None:
    """The deadline a sink sending at `now` writes for `envelope`: its `expires_at`, or `now`
    plus the time to live of a message the bridge originates; None for a copy."""
    ttl = envelope.time_to_live_ms
    if (ttl is None and envelope.expires_at is None) or never_expires(envelope.headers):
        return None
    return envelope.expires_at if ttl is None else now + ttl / 1000


def time_to_live_ms(envelope: Envelope, now: float) -> float | None:
    """The milliseconds of lifetime a sink sending at `now` writes for `envelope`: the time to
    live of a message the bridge originates, as given; else what is left until its
    `expires_at` (fractional, and <= 0 once spent: each codec rounds it as its field needs);
    None for no lifetime or a copy."""
    if envelope.time_to_live_ms is not None:
        milliseconds = float(envelope.time_to_live_ms)
    elif envelope.expires_at is not None:
        milliseconds = (envelope.expires_at - now) * 1000
    else:
        return None
    return None if never_expires(envelope.headers) else milliseconds
