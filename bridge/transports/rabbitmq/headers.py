"""The AMQP message codec (wire-format §7): `outgoing` is the inverse of `incoming`.

Written as an NServiceBus RabbitMQ 11 endpoint writes it: `message_id` = `NServiceBus.MessageId`
(required: an envelope without one raises `MessageRejected`); `delivery_mode` 2, or 1 when the
header `NServiceBus.Transport.RabbitMQ.UseNonPersistentDelivery` is present (it is not written);
`correlation_id`, `reply_to` and `content_type` from their headers (`application/octet-stream`
when there is no content type); `type` = `NServiceBus.EnclosedMessageTypes` up to the first
comma; the body as is; and every header in the `headers` table, values as AMQP long strings.
No `timestamp`: NServiceBus sets none.

Time to live: the AMQP `expiration` alone, as NServiceBus RabbitMQ reads and writes it; the
`NServiceBus.TimeToBeReceived` header is never read and never rewritten. An envelope with
`expires_at` is sent with `expiration` = its remaining lifetime in whole milliseconds (at least
1: an expired envelope still goes out, the runner drops those before); a message the bridge
originates, with the time to live it was given (`time_to_live_ms`). On read, `expires_at` =
the moment the bridge took delivery (`received`) + `expiration`. RabbitMQ drops a message
whose `expiration` passed while it was queued and never tells how long one waited, so a
message delivered is alive and what is left of its lifetime is at most `expiration`: counting
from receipt never drops a live message, and at worst hands on more time than was left (by as
long as it waited in the queue). Error-queue and audit copies (`NServiceBus.FailedQ`,
`NServiceBus.ProcessingEnded`) never expire: no `expiration` is read or written for them
(`bridge.nservicebus.lifetime`).

Null: a null value is written as AMQP void, as the .NET client writes a null string, but a void
an endpoint wrote must read as "" (wire-format §7). So an envelope with a null value also
carries `NServiceBus.Bridge.HeaderLayout`, a JSON object `{"null": [names]}`, and only such an
envelope: on read the layout header is removed and void is None for a name it lists, "" for
any other. Nothing else needs it, so a message an endpoint wrote (which has no null to carry:
an endpoint's void reads as "") crosses RabbitMQ -> RabbitMQ or -> SQL without it. Header order
is not carried: NServiceBus reads headers into a dictionary on every transport; a queue hands
the table back in the order it was written, but a quorum queue that redelivers a message
(adding `x-delivery-count`) sorts it by name, for every reader alike. UseNonPersistentDelivery
needs no layout either: `delivery_mode` 1 carries it, and it reads back as "True" (NServiceBus
acts on its presence, never its value). A layout that also has an `"order"` list (written by
earlier versions of the bridge) reads the same; the list is ignored. Repeated names collapse,
the last value wins at the first position (`Headers.to_dict`).

Read: properties `reply_to`, `correlation_id` and `content_type` overwrite their headers when
they differ from what the headers would have produced (a `content_type` of
`application/octet-stream` over no header adds none); a legacy
`NServiceBus.RabbitMQ.CallbackQueue` header then overwrites `NServiceBus.ReplyToAddress`, as
NServiceBus does; `delivery_mode` 1 sets UseNonPersistentDelivery to "True" (its value is not
carried, only its presence); `type` fills `NServiceBus.EnclosedMessageTypes` when that header
is missing and `message_id` fills `NServiceBus.MessageId` (a message with neither is poison,
so is one whose short-string properties or header names are not UTF-8). Values that are not
strings are rendered as NServiceBus renders them: byte arrays as UTF-8, with U+FFFD for bytes
that are not (never poison), booleans `True`/`False`, numbers in invariant form, timestamps in
the NServiceBus wire format (a naive one, as pika 1.3 decodes them, is UTC), tables `k=v,k=v`,
arrays `a;b`. Removed on read: `x-death*`, `x-first-death-*`, `x-last-death-*`,
`x-delivery-count`, `x-dotnet-pub-seq-no` (the .NET client adds it to every publish when it
tracks confirms), `NServiceBus.Transport.RabbitMQ.DelayInSeconds` and `...ConfirmationId`. A
header name that is not UTF-8 raises `HeadersFormatError` (the source makes the message a
`PoisonMessage`).

Lossy, on purpose: the AMQP properties the mapping does not name (`priority`, `timestamp`,
`app_id`, `user_id`, `cluster_id`, `content_encoding`) are not read; UseNonPersistentDelivery
comes back as "True"; a CallbackQueue header wins over the reply address it was sent with;
header bytes that are not UTF-8 come back with replacement characters; header order comes
back as the queue hands it over; repeated header names collapse.
"""

from __future__ import annotations

import decimal
import functools
import json
import math
from datetime import UTC, datetime
from typing import Any

import pika

from bridge.envelope import MESSAGE_ID, Envelope, Headers, PoisonMessage
from bridge.errors import HeadersFormatError, MessageRejected
from bridge.nservicebus.lifetime import never_expires, time_to_live_ms
from bridge.nservicebus.wireformat import format_timestamp
from bridge.transports.rabbitmq.amqp_table import sized_properties

__all__ = [
    "CALLBACK_QUEUE",
    "CONFIRMATION_ID",
    "CONTENT_TYPE",
    "CORRELATION_ID",
    "DEFAULT_CONTENT_TYPE",
    "DELAY_IN_SECONDS",
    "ENCLOSED_MESSAGE_TYPES",
    "FRAME_MAX",
    "LAYOUT",
    "NON_PERSISTENT",
    "PUBLISH_SEQUENCE_NUMBER",
    "REPLY_TO",
    "incoming",
    "incoming_poison",
    "outgoing",
    "readable_text",
]

CORRELATION_ID = "NServiceBus.CorrelationId"
REPLY_TO = "NServiceBus.ReplyToAddress"
CONTENT_TYPE = "NServiceBus.ContentType"
ENCLOSED_MESSAGE_TYPES = "NServiceBus.EnclosedMessageTypes"
NON_PERSISTENT = "NServiceBus.Transport.RabbitMQ.UseNonPersistentDelivery"
DELAY_IN_SECONDS = "NServiceBus.Transport.RabbitMQ.DelayInSeconds"
CONFIRMATION_ID = "NServiceBus.Transport.RabbitMQ.ConfirmationId"
CALLBACK_QUEUE = "NServiceBus.RabbitMQ.CallbackQueue"
PUBLISH_SEQUENCE_NUMBER = "x-dotnet-pub-seq-no"
LAYOUT = "NServiceBus.Bridge.HeaderLayout"
DEFAULT_CONTENT_TYPE = "application/octet-stream"

#: AMQP's default (and RabbitMQ's) largest frame; the properties must fit in one.
FRAME_MAX = 131_072

_STRIPPED = frozenset(
    {"x-delivery-count", PUBLISH_SEQUENCE_NUMBER, DELAY_IN_SECONDS, CONFIRMATION_ID}
)
_STRIPPED_PREFIXES = ("x-death", "x-first-death-", "x-last-death-")
#: The delay header in a table: its name's length octet and name, type octet, Int32.
_DELAY_FIELD = 1 + len("NServiceBus.Transport.RabbitMQ.DelayInSeconds") + 1 + 4
#: Frame header and end (8), content header class, weight, body size and flags (14).
_FRAME_OVERHEAD = 22
#: An `expiration` this long (1000 years) means "never expires" (and overflows no date).
_FOREVER_MS = 1000 * 365 * 86_400_000
_MISSING: Any = object()
#: Longer layout texts are parsed each time, not kept.
_LAYOUT_CACHED = 4096
#: How many layout texts each direction keeps, parsed or written.
_LAYOUTS_KEPT = 64
_LAYOUT_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def outgoing(
    envelope: Envelope, now: float, *, frame_max: int = FRAME_MAX, delay: int = 0
) -> tuple[pika.BasicProperties, bytes]:
    """Lay `envelope` out as an AMQP message sent at `now` (epoch seconds), delayed `delay`
    seconds (`delays.py`) when that is more than 0.

    Raises `MessageRejected` (no index) for an envelope AMQP cannot carry: no message id, a
    property or header name over 255 bytes, text that is not encodable as UTF-8, properties
    larger than one frame, or a delay together with a time to be received (NServiceBus
    refuses that: Sending/BasicPropertiesExtensions.cs:30-36 of NServiceBus.RabbitMQ).
    """
    headers = envelope.headers.to_dict()
    message_id = headers.get(MESSAGE_ID)
    if message_id is None or not message_id.strip():
        raise MessageRejected(f"{MESSAGE_ID} is missing; RabbitMQ endpoints require a message id")
    expiration: str | None = None
    lifetime = time_to_live_ms(envelope, now)
    if lifetime is not None:
        if delay > 0:
            raise MessageRejected(
                "a delayed message cannot have a time to be received; NServiceBus refuses "
                "postponed delivery of messages with TimeToBeReceived set"
            )
        expiration = str(max(1, math.floor(lifetime)))
    persistent = headers.pop(NON_PERSISTENT, _MISSING) is _MISSING
    nulls = tuple(name for name, value in headers.items() if value is None)
    table: dict[str, str | None] = headers  # no copy: below, `headers` is never read for LAYOUT
    if nulls:
        table[LAYOUT] = _layout_text(nulls)
    enclosed = headers.get(ENCLOSED_MESSAGE_TYPES)
    content_type = headers.get(CONTENT_TYPE)
    properties, size = sized_properties(
        table,
        DEFAULT_CONTENT_TYPE if content_type is None else content_type,
        2 if persistent else 1,
        headers.get(CORRELATION_ID),
        headers.get(REPLY_TO),
        expiration,
        message_id,
        None if enclosed is None else enclosed.split(",", 1)[0],
    )
    if delay > 0:
        # An Int32 as NServiceBus writes it; a new table, which pika encodes (amqp_table.py).
        properties.headers = {**table, DELAY_IN_SECONDS: delay}
        size += _DELAY_FIELD
    if size + _FRAME_OVERHEAD > frame_max:
        raise MessageRejected(
            f"properties and headers take {size} bytes; one AMQP frame holds {frame_max}"
        )
    return properties, envelope.body


@functools.lru_cache(maxsize=_LAYOUTS_KEPT)
def _layout_text(nulls: tuple[str, ...]) -> str:
    """The layout header's JSON; a sender writes the same few null names over and over."""
    return _LAYOUT_JSON({"null": list(nulls)})


def _text(value: object) -> str | None:
    """An AMQP field value as the string NServiceBus makes of it (None for void)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, datetime):
        # pika 1.3 decodes an AMQP timestamp as a naive datetime; it is UTC.
        return format_timestamp(value if value.tzinfo else value.replace(tzinfo=UTC))
    if isinstance(value, dict):
        return ",".join(f"{_name(k)}={_text(v) or ''}" for k, v in value.items())
    if isinstance(value, list):
        return ";".join(_text(v) or "" for v in value)
    return str(value)


def _name(name: str | bytes) -> str:
    if isinstance(name, bytes):
        raise HeadersFormatError(f"a header name is not UTF-8: {name!r}")
    return name


def _layout_nulls(raw: object) -> frozenset[str]:
    """The names the layout header lists as null; none when it is absent or unreadable."""
    if raw is None:
        return frozenset()
    try:
        text = _text(raw) or ""
    except HeadersFormatError:
        return frozenset()
    if len(text) > _LAYOUT_CACHED:
        return _parse_layout(text)
    return _cached_layout(text)


def _parse_layout(text: str) -> frozenset[str]:
    try:
        nulls = json.loads(text).get("null", [])
    except (ValueError, AttributeError):
        return frozenset()
    if not isinstance(nulls, list):
        return frozenset()
    return frozenset(n for n in nulls if isinstance(n, str))


# One sender writes the same layout on every message of a kind: parse each text once.
_cached_layout = functools.lru_cache(maxsize=_LAYOUTS_KEPT)(_parse_layout)


def _property(properties: pika.BasicProperties, name: str) -> str | None:
    """A short-string property; pika hands over bytes when it is not UTF-8: that is poison."""
    value = getattr(properties, name)
    if isinstance(value, bytes):
        raise HeadersFormatError(f"the {name} property is not UTF-8: {value!r}")
    return value if isinstance(value, str) else None


def _overwrite(items: dict[str, str | None], name: str, value: str | None) -> None:
    if value is not None and items.get(name) != value:
        items[name] = value


def incoming(properties: pika.BasicProperties, body: bytes, received: float) -> Envelope:
    """The envelope of an AMQP message delivered to the bridge at `received` (epoch seconds);
    raise HeadersFormatError when it is poison."""
    table: dict[str | bytes, object] = properties.headers or {}
    nulls = _layout_nulls(table.get(LAYOUT))
    items: dict[str, str | None] = {}
    for name, value in table.items():
        if type(name) is not str:
            name = _name(name)
        if name == LAYOUT or name in _STRIPPED or name.startswith(_STRIPPED_PREFIXES):
            continue
        if type(value) is str:  # nearly every value: skip the conversion
            items[name] = value
            continue
        text = _text(value)
        items[name] = text if text is not None or name in nulls else ""
    _overwrite(items, REPLY_TO, _property(properties, "reply_to"))
    if CALLBACK_QUEUE in items:  # a legacy reply address: it wins, as in NServiceBus
        items[REPLY_TO] = items[CALLBACK_QUEUE]
    _overwrite(items, CORRELATION_ID, _property(properties, "correlation_id"))
    content_type = _property(properties, "content_type")
    written = items.get(CONTENT_TYPE)
    if content_type is not None and content_type != (
        DEFAULT_CONTENT_TYPE if written is None else written
    ):
        items[CONTENT_TYPE] = content_type
    if properties.delivery_mode == 1 and NON_PERSISTENT not in items:
        items[NON_PERSISTENT] = "True"
    enclosed = _property(properties, "type")
    if ENCLOSED_MESSAGE_TYPES not in items and enclosed is not None:
        items[ENCLOSED_MESSAGE_TYPES] = enclosed
    native = _property(properties, "message_id")
    message_id = items.get(MESSAGE_ID)
    if message_id is None or not message_id.strip():
        if native is None or not native.strip():
            raise HeadersFormatError(
                f"neither the message_id property nor an {MESSAGE_ID} header is set"
            )
        items[MESSAGE_ID] = native
    expires_at = None
    if properties.expiration is not None and not never_expires(items):
        expires_at = _expires_at(properties.expiration, received)
    return Envelope(Headers(items.items()), body, expires_at=expires_at, native_id=native)


def _expires_at(expiration: object, received: float) -> float | None:
    """`received` + `expiration` milliseconds; None when it is not a number RabbitMQ takes
    (ASCII digits; str.isdigit() also accepts '²', which int() refuses) or is forever."""
    if not isinstance(expiration, str) or not (expiration.isascii() and expiration.isdigit()):
        return None
    milliseconds = int(expiration)
    if milliseconds >= _FOREVER_MS:
        return None
    return received + milliseconds / 1000


def readable_text(value: object) -> str | None:
    """A field value as text, for messages and logs: never raises."""
    try:
        return _text(value)
    except HeadersFormatError:
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        return repr(value)


def incoming_poison(
    properties: pika.BasicProperties, body: bytes, error: BaseException
) -> PoisonMessage:
    """The poison message for an AMQP message `incoming` refused with `error`.

    `headers` is what could be read (bytes decoded with replacement characters) and
    `raw_headers` those as a JSON object; the source keeps the AMQP message itself for the
    error queue, byte for byte.
    """
    readable: dict[str, str | None] = {}
    for name, value in (properties.headers or {}).items():
        key = name.decode("utf-8", "replace") if isinstance(name, bytes) else name
        readable[key] = readable_text(value)
    native = readable_text(properties.message_id)
    if MESSAGE_ID not in readable and native:
        readable[MESSAGE_ID] = native
    return PoisonMessage(
        raw_headers=json.dumps(readable, ensure_ascii=False),
        body=body,
        reason=str(error),
        exception_type=type(error).__name__,
        native_id=native,
        headers=Headers(readable.items()),
    )
