"""Delays the bridge is asked for (`bridge send --delay | --deliver-at`): parsed here, carried
on the envelope as `deliver_at`, and carried out by the destination's native means.

Which destinations can hold a delay, and for how long, is each connection type's
`MAX_DELAY_SECONDS` (its config module; None: it cannot). Every sink that delays refuses a
message asking for longer, by itself (`too_long`): the request may come from a Kafka record,
not only from `bridge send`, which checks first. A delay together with a time to be
received is refused, as NServiceBus refuses it: a message that waits may expire before it is
due (NServiceBus.RabbitMQ Sending/BasicPropertiesExtensions.cs:30-36).

`NServiceBus.DeliverAt`, which NServiceBus writes on a message it delayed itself, is never read:
such a message reaches the bridge when due, and delaying it again would double the delay.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from bridge.envelope import Envelope
from bridge.errors import MessageRejected
from bridge.nservicebus.wireformat import parse_timespan, timestamp_seconds

__all__ = [
    "DELAY_WITH_TTL",
    "DELIVER_AT",
    "parse_delay",
    "parse_deliver_at",
    "parse_delivery_request",
    "refuse_delays",
    "too_long",
]

#: A producer's request that the message be delivered no earlier than this time: the Kafka
#: record header that asks the bridge for a delay (`bridge.transports.kafka.headers`), also
#: kept on the error-queue copy of a delayed message (`bridge.nservicebus.deadletter`).
DELIVER_AT = "NServiceBus.Bridge.DeliverAt"

DELAY_WITH_TTL = (
    "a delayed message cannot have a time to be received: NServiceBus refuses postponed "
    "delivery of messages with TimeToBeReceived set"
)


def parse_delay(text: str) -> timedelta:
    """A delay as a .NET TimeSpan (`00:00:05`, `1.00:00:00`); ValueError for anything else or
    for a span of zero or less."""
    try:
        span = parse_timespan(text)
    except (ValueError, OverflowError):
        span = None
    if span is None or span <= timedelta(0):
        raise ValueError(f"takes a time span greater than zero, such as 00:00:05, got {text!r}")
    return span


def parse_deliver_at(text: str) -> datetime:
    """A moment with its UTC offset (ISO 8601: `2026-11-26T10:00:00Z`, `...+01:00`); ValueError
    for anything else, a moment without an offset included (whose zone would be a guess)."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise ValueError(
            f"takes an ISO 8601 time with its UTC offset, such as 2026-11-26T10:00:00Z, "
            f"got {text!r}"
        )
    return moment


def parse_delivery_request(text: str) -> float:
    """A delivery time as a header carries it (epoch seconds): NServiceBus's timestamp format
    (`2026-11-26 10:00:00:000000 Z`) or ISO 8601 with its UTC offset; ValueError otherwise."""
    try:
        return timestamp_seconds(text)
    except ValueError:
        return parse_deliver_at(text).timestamp()


def refuse_delays(envelopes: Sequence[Envelope], now: float, where: str) -> None:
    """For a destination that cannot delay: `MessageRejected` naming the first envelope whose
    `deliver_at` is still to come (sending it now would deliver it early)."""
    for index, envelope in enumerate(envelopes):
        if envelope.deliver_at is not None and envelope.deliver_at > now:
            raise MessageRejected(
                f"{where}: message {index} asks to be delivered in "
                f"{envelope.deliver_at - now:.0f} s, and this destination cannot delay a "
                "message",
                index=index,
            )


def too_long(
    envelope: Envelope, now: float, longest: int, where: str, index: int
) -> MessageRejected | None:
    """A `MessageRejected` naming `envelope` (at `index` of its send) when it asks to be
    delivered more than `longest` seconds after `now`; None otherwise."""
    if envelope.deliver_at is None or envelope.deliver_at - now <= longest:
        return None
    return MessageRejected(
        f"{where}: message {index} asks to be delivered in {envelope.deliver_at - now:.0f} s, "
        f"longer than the {longest} s ({timedelta(seconds=longest)}) this destination can "
        "delay a message",
        index=index,
    )
