"""An outgoing message's AMQP properties and their encoded size: the seam `amqp_table`.

Why: pika's table encoder is most of the cost of laying a message out; the fast path encodes the
header table once, while sizing it, from the cached starts of the few dozen header names
endpoints repeat, and `_Outgoing.encode` hands pika those bytes. Bench: `bench/speedups.py
amqp_table`. Plain: `pika.BasicProperties`, encoded by pika, sized by `properties_size`.
Equivalence: `tests/unit/test_rabbitmq_amqp_table.py` (the content header frames are
byte-identical to pika's own encoding, and read back to the same envelope).

`sized_properties(headers, content_type, ..., type_)` returns the properties and the bytes they
take in a content header frame, and raises `MessageRejected` for what AMQP cannot carry: a
property or header name over 255 bytes, or text that is not encodable as UTF-8.
"""

from __future__ import annotations

import struct
from typing import Any

import pika

from bridge import speedups
from bridge.errors import MessageRejected

__all__ = ["fast_properties", "plain_properties", "properties_size", "sized_properties"]

_SHORT_STRING = 255
#: A string this long is at most 252 bytes of UTF-8, so surely a valid AMQP short string.
_SURELY_SHORT = _SHORT_STRING // 4
_LENGTH = struct.Struct(">I").pack
#: The encoded start of a header-table field (name and type octet) by header name.
_STRING_FIELDS: dict[str, bytes] = {}
_VOID_FIELDS: dict[str, bytes] = {}
#: How many names each of those keeps; a message's own names (ids in them) must not pile up.
_FIELD_STARTS_KEPT = 256
_SHORT_PROPERTIES = ("content_type", "correlation_id", "reply_to", "expiration", "message_id")


def plain_properties(
    headers: dict[str, str | None],
    content_type: str | None,
    delivery_mode: int,
    correlation_id: str | None,
    reply_to: str | None,
    expiration: str | None,
    message_id: str | None,
    type_: str | None,
) -> tuple[pika.BasicProperties, int]:
    """pika's properties, sized by the exact checks."""
    properties = pika.BasicProperties(
        content_type=content_type,
        headers=headers,
        delivery_mode=delivery_mode,
        correlation_id=correlation_id,
        reply_to=reply_to,
        expiration=expiration,
        message_id=message_id,
        type=type_,
    )
    return properties, properties_size(properties)


def fast_properties(
    headers: dict[str, str | None],
    content_type: str | None,
    delivery_mode: int,
    correlation_id: str | None,
    reply_to: str | None,
    expiration: str | None,
    message_id: str | None,
    type_: str | None,
) -> tuple[pika.BasicProperties, int]:
    """Properties whose header table is encoded while sizing it, and reused by `encode`."""
    properties = _Outgoing(
        content_type=content_type,
        headers=headers,
        delivery_mode=delivery_mode,
        correlation_id=correlation_id,
        reply_to=reply_to,
        expiration=expiration,
        message_id=message_id,
        type=type_,
    )
    size = _encoded_size(properties, headers)
    return properties, properties_size(properties) if size is None else size


def properties_size(properties: pika.BasicProperties) -> int:
    """Bytes the properties take in a content header frame; checks AMQP's length limits."""
    size = 0
    try:
        for what in (*_SHORT_PROPERTIES, "type"):
            value = getattr(properties, what)
            if value is not None:
                size += _short(what, value)
        size += 1  # delivery_mode
        if properties.timestamp is not None:
            size += 8
        size += 4  # the table's length
        for name, value in (properties.headers or {}).items():
            size += _short(f"header name {name[:40]!r}...", name) + 1
            if value is not None:
                size += 4 + len(value.encode())
    except UnicodeEncodeError as exc:
        raise MessageRejected(f"a header is not encodable as UTF-8: {exc}") from exc
    return size


def _short(what: str, value: str) -> int:
    size = len(value.encode())
    if size > _SHORT_STRING:
        raise MessageRejected(f"{what} is {size} bytes; AMQP allows {_SHORT_STRING}")
    return 1 + size


class _Outgoing(pika.BasicProperties):  # type: ignore[misc]
    """Properties whose header table is encoded once, when it is sized; `encode` (pika calls
    it to build the content header frame) puts those bytes where pika's own table encoder
    would have put the same bytes. The table is final: a `headers` replaced afterwards is
    encoded by pika; one changed in place would go out as it was (nothing here changes it)."""

    # Slots, not attributes: pika compares and prints properties by their __dict__.
    __slots__ = ("table", "table_of")
    headers: Any

    def keep_table(self, table: bytes) -> None:
        self.table, self.table_of = table, self.headers

    def encode(self) -> list[bytes]:
        headers = self.headers
        if headers is None or getattr(self, "table_of", None) is not headers:
            return list(super().encode())
        self.headers = None
        try:
            rest = b"".join(super().encode())
        finally:
            self.headers = headers
        # Property flags (one word: BasicProperties has 14), then content_type and
        # content_encoding as short strings, then the table.
        at = 2
        if self.content_type is not None:
            at += 1 + rest[at]
        if self.content_encoding is not None:
            at += 1 + rest[at]
        flags = int.from_bytes(rest[:2], "big") | pika.BasicProperties.FLAG_HEADERS
        return [flags.to_bytes(2, "big"), rest[2:at], self.table, rest[at:]]


def _encoded_size(properties: _Outgoing, headers: dict[str, str | None]) -> int | None:
    """`properties_size`, from the encoded table; None when that must check each string: one
    is longer than `_SURELY_SHORT` characters or not encodable. Keeps the encoded table."""
    table = _encode_table(headers)
    if table is None:
        return None
    strings = [
        value
        for value in (*(getattr(properties, name) for name in _SHORT_PROPERTIES), properties.type)
        if value is not None
    ]
    try:
        if max(map(len, strings)) > _SURELY_SHORT:
            return None
        size = len("".join(strings).encode()) + len(strings)
    except (TypeError, ValueError):  # UnicodeEncodeError is a ValueError
        return None
    properties.keep_table(table)
    return size + 1 + (0 if properties.timestamp is None else 8) + len(table)


def _encode_table(table: dict[str, str | None]) -> bytes | None:
    """An AMQP field table of long strings and voids, or None when a name or value is not
    such (too long, not encodable, not a string): then the exact checks tell what is wrong."""
    fields: list[bytes] = []
    add = fields.append
    strings, voids = _STRING_FIELDS, _VOID_FIELDS
    try:
        for name, value in table.items():
            if value is None:
                start = voids.get(name)
                if start is None:
                    start = _field_start(voids, name, b"V")
                add(start)
            else:
                start = strings.get(name)
                if start is None:
                    start = _field_start(strings, name, b"S")
                text = value.encode()
                add(start)
                add(_LENGTH(len(text)))
                add(text)
    except (AttributeError, OverflowError, UnicodeEncodeError, struct.error):
        return None
    body = b"".join(fields)
    return _LENGTH(len(body)) + body


def _field_start(kept: dict[str, bytes], name: str, kind: bytes) -> bytes:
    """A field's name (a short string) and its type octet; raises for a name AMQP cannot
    carry. Kept: endpoints send the same few dozen header names on every message."""
    encoded = name.encode()
    start = b"%c%b%b" % (len(encoded), encoded, kind)
    if len(kept) >= _FIELD_STARTS_KEPT:
        kept.clear()  # what is sent again soon is kept again soon
    kept[name] = start
    return start


sized_properties = fast_properties if speedups.enabled("amqp_table") else plain_properties
