"""The AMQP message codec (wire-format §7): `outgoing` is the inverse of `incoming`.

Written as an NServiceBus RabbitMQ 11 endpoint writes it: `message_id` = `NServiceBus.MessageId`
(required: an envelope without one raises `MessageRejected`); `delivery_mode` 2, or 1 when the
header `NServiceBus.Transport.RabbitMQ.UseNonPersistentDelivery` is present (it is not written);
`correlation_id`, `reply_to` and `content_type` from their headers (`application/octet-stream`
when there is no content type); `type` = `NServiceBus.EnclosedMessageTypes` up to the first
comma; the body as is; and every header in the `headers` table, values as AMQP long strings.

Time to live: an envelope with `expires_at` is sent with `expiration` = the remaining lifetime in
whole milliseconds (at least 1: an expired envelope still goes out, the runner drops those
before), `NServiceBus.TimeToBeReceived` rewritten to that same remaining lifetime, and
`timestamp` = the send time (whole seconds). On read, `expires_at` = send time + lifetime, where
the send time is the `timestamp` property, else the `NServiceBus.TimeSent` header, and the
lifetime is the TimeToBeReceived header, else the `expiration` property; without both it is
None. RabbitMQ never tells how long a message waited, so `expiration` alone cannot give the
remaining lifetime; a bridge-written message reads back within half a second (`timestamp` has
whole seconds).

Null and order: a null value is written as AMQP void, as the .NET client writes a null string,
but a void an endpoint wrote must read as "" (wire-format §7), and quorum queues hand tables
back sorted by name. So an envelope with a null value, a header order that is not already
sorted (bytewise), or UseNonPersistentDelivery also carries `NServiceBus.Bridge.HeaderLayout`,
a JSON object `{"order": [names], "null": [names]}`. On read the layout header is removed,
names it lists come first in its order, the rest follow as received, and void is None for a
name the layout lists as null and "" otherwise. Repeated names collapse, the last value wins at
the first position (`Headers.to_dict`).

Read: properties `reply_to`, `correlation_id` and `content_type` overwrite their headers when
they differ from what the headers would have produced (a `content_type` of
`application/octet-stream` over no header adds none); `delivery_mode` 1 sets
UseNonPersistentDelivery to "True" (its value is not carried, only its presence); `type` fills
`NServiceBus.EnclosedMessageTypes` when that header is missing and `message_id` fills
`NServiceBus.MessageId` (a message with neither is poison, so is one whose short-string
properties are not UTF-8). Values that are not strings are
rendered as NServiceBus renders them: byte arrays as UTF-8, booleans `True`/`False`, numbers in
invariant form, timestamps in the NServiceBus wire format, tables `k=v,k=v`, arrays `a;b`.
Removed on read: `x-death*`, `x-first-death-*`, `x-last-death-*`, `x-delivery-count`,
`NServiceBus.Transport.RabbitMQ.DelayInSeconds` and `...ConfirmationId`. A header name or value
that is not UTF-8 raises `HeadersFormatError` (the source makes the message a `PoisonMessage`).

Lossy, on purpose: the AMQP properties the mapping does not name (`priority`, `app_id`,
`user_id`, `cluster_id`, `content_encoding`) are not read; UseNonPersistentDelivery comes back
as "True"; repeated header names collapse; a TimeToBeReceived header on an envelope without
`expires_at` is carried as is, without `expiration`.
"""

from __future__ import annotations

import decimal
import functools
import json
import math
from datetime import datetime, timedelta
from typing import Any

import pika

from bridge.envelope import (
    MESSAGE_ID,
    TIME_SENT,
    TIME_TO_BE_RECEIVED,
    Envelope,
    Headers,
    PoisonMessage,
)
from bridge.errors import HeadersFormatError, MessageRejected
from bridge.nservicebus.wireformat import (
    format_timespan,
    format_timestamp,
    parse_timespan,
    timestamp_seconds,
)
from bridge.transports.rabbitmq.amqp_table import sized_properties

__all__ = [
    "CONFIRMATION_ID",
    "CONTENT_TYPE",
    "CORRELATION_ID",
    "DEFAULT_CONTENT_TYPE",
    "DELAY_IN_SECONDS",
    "ENCLOSED_MESSAGE_TYPES",
    "FRAME_MAX",
    "LAYOUT",
    "NON_PERSISTENT",
    "REPLY_TO",
    "TIME_SENT",
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
LAYOUT = "NServiceBus.Bridge.HeaderLayout"
DEFAULT_CONTENT_TYPE = "application/octet-stream"

#: AMQP's default (and RabbitMQ's) largest frame; the properties must fit in one.
FRAME_MAX = 131_072

_STRIPPED = frozenset({"x-delivery-count", DELAY_IN_SECONDS, CONFIRMATION_ID})
_STRIPPED_PREFIXES = ("x-death", "x-first-death-", "x-last-death-")
#: Frame header and end (8), content header class, weight, body size and flags (14).
_FRAME_OVERHEAD = 22
#: A lifetime this long means "never expires" (TimeSpan.MaxValue is ~29,000 years).
_FOREVER = timedelta(days=365 * 1000)
_MISSING: Any = object()
#: Longer layout texts are not kept.
_LAYOUT_CACHED = 4096
#: How many layout texts each direction keeps, parsed or written.
_LAYOUTS_KEPT = 64
_LAYOUT_TEXTS: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}
_LAYOUT_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def outgoing(
    envelope: Envelope, now: float, *, frame_max: int = FRAME_MAX
) -> tuple[pika.BasicProperties, bytes]:
    """Lay `envelope` out as an AMQP message sent at `now` (epoch seconds).

    Raises `MessageRejected` (no index) for an envelope AMQP cannot carry: no message id, a
    property or header name over 255 bytes, text that is not encodable as UTF-8, or properties
    larger than one frame.
    """
    headers = envelope.headers.to_dict()
    message_id = headers.get(MESSAGE_ID)
    if message_id is None or not message_id.strip():
        raise MessageRejected(f"{MESSAGE_ID} is missing; RabbitMQ endpoints require a message id")
    expiration: str | None = None
    timestamp: int | None = None
    if envelope.expires_at is not None:
        remaining_ms = max(1, math.floor((envelope.expires_at - now) * 1000))
        expiration = str(remaining_ms)
        timestamp = round(now)
        headers[TIME_TO_BE_RECEIVED] = format_timespan(timedelta(milliseconds=remaining_ms))
    order = list(headers)
    persistent = headers.pop(NON_PERSISTENT, _MISSING) is _MISSING
    nulls = [name for name, value in headers.items() if value is None]
    table: dict[str, str | None] = headers  # no copy: below, `headers` is never read for LAYOUT
    try:
        "".join(order).encode()  # every name at once; on failure, find the first one
    except UnicodeEncodeError:
        try:
            sorted(order, key=str.encode)  # raises for the first name that is not encodable
        except UnicodeEncodeError as exc:
            raise MessageRejected(f"a header name is not encodable as UTF-8: {exc}") from exc
    # For encodable text, code point order is UTF-8 byte order.
    if nulls or not persistent or order != sorted(order):
        table[LAYOUT] = _layout_text(tuple(order), tuple(nulls))
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
        timestamp,
        None if enclosed is None else enclosed.split(",", 1)[0],
    )
    if size + _FRAME_OVERHEAD > frame_max:
        raise MessageRejected(
            f"properties and headers take {size} bytes; one AMQP frame holds {frame_max}"
        )
    return properties, envelope.body


def _layout_text(order: tuple[str, ...], nulls: tuple[str, ...]) -> str:
    """The layout header's JSON; endpoints send the same few header orders over and over."""
    key = (order, nulls)
    text = _LAYOUT_TEXTS.get(key)
    if text is None:
        layout = {"order": list(order), "null": list(nulls)} if nulls else {"order": list(order)}
        text = _LAYOUT_JSON(layout)
        if len(text) <= _LAYOUT_CACHED:
            if len(_LAYOUT_TEXTS) >= _LAYOUTS_KEPT:
                _LAYOUT_TEXTS.clear()  # what is sent again soon is kept again soon
            _LAYOUT_TEXTS[key] = text
    return text


def _text(value: object) -> str | None:
    """An AMQP field value as the string NServiceBus makes of it (None for void)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError as exc:
            raise HeadersFormatError(f"a header value is not UTF-8: {exc}") from exc
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, datetime):
        return format_timestamp(value)
    if isinstance(value, dict):
        return ",".join(f"{_name(k)}={_text(v) or ''}" for k, v in value.items())
    if isinstance(value, list):
        return ";".join(_text(v) or "" for v in value)
    return str(value)


def _name(name: str | bytes) -> str:
    if isinstance(name, bytes):
        raise HeadersFormatError(f"a header name is not UTF-8: {name!r}")
    return name


def _layout(raw: object) -> tuple[tuple[str, ...], frozenset[str]]:
    """Names in their written order and the names written as null; empty when unreadable."""
    try:
        text = _text(raw) or ""
    except HeadersFormatError:
        return (), frozenset()
    if len(text) > _LAYOUT_CACHED:
        return _parse_layout(text)
    return _cached_layout(text)


def _parse_layout(text: str) -> tuple[tuple[str, ...], frozenset[str]]:
    try:
        layout = json.loads(text)
        order, nulls = layout.get("order", []), layout.get("null", [])
    except (ValueError, AttributeError):
        return (), frozenset()
    if not isinstance(order, list) or not isinstance(nulls, list):
        return (), frozenset()
    names = tuple(n for n in order if isinstance(n, str))
    return names, frozenset(n for n in nulls if isinstance(n, str))


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


def incoming(properties: pika.BasicProperties, body: bytes) -> Envelope:
    """The envelope an AMQP message carries; raise HeadersFormatError when it is poison."""
    table: dict[str | bytes, object] = properties.headers or {}
    order, nulls = _layout(table.get(LAYOUT))
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
    if order:
        placed = {name: items[name] for name in order if name in items}
        if len(placed) != len(items):  # else every name is placed already
            placed.update(items)
        items = placed
    return Envelope(
        Headers(items.items()),
        body,
        expires_at=_expires_at(properties, items),
        native_id=native,
    )


def _is_ascii_digits(text: str) -> bool:
    # str.isdigit() also accepts '²' and other digits int() refuses.
    return text.isascii() and text.isdigit()


def _expires_at(properties: pika.BasicProperties, items: dict[str, str | None]) -> float | None:
    # The lifetime first: most messages have none, and then TimeSent need not be read.
    lifetime: timedelta | None = None
    if items.get(TIME_TO_BE_RECEIVED):
        try:
            lifetime = parse_timespan(items[TIME_TO_BE_RECEIVED] or "")
        except ValueError:
            lifetime = None
    elif isinstance(properties.expiration, str) and _is_ascii_digits(properties.expiration):
        milliseconds = int(properties.expiration)
        if milliseconds < _FOREVER / timedelta(milliseconds=1):  # beyond: never (no overflow)
            lifetime = timedelta(milliseconds=milliseconds)
    if lifetime is None or lifetime >= _FOREVER:
        return None
    sent: float | None = None
    if isinstance(properties.timestamp, int):
        sent = float(properties.timestamp)
    elif items.get(TIME_SENT):
        try:
            sent = timestamp_seconds(items[TIME_SENT] or "")
        except ValueError:
            sent = None
    if sent is None:
        return None
    return sent + lifetime.total_seconds()


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
