"""The Kafka record codec (wire-format §9): `outgoing` is the inverse of `incoming`.

Written: record value = body bytes; one record header per NServiceBus header, in order, with
duplicates kept; values UTF-8; a null header value is a null Kafka header value (not empty).
The record key is chosen by the route's key spec: `header:NAME` (default
`header:NServiceBus.MessageId`) is that header's UTF-8 value, `none` (or an absent or null
header) is no key. Every record carries `now` as its timestamp.

Time to live: Kafka has none of its own, so the bridge writes a deadline header,
`NServiceBus.Bridge.ExpiresAt` (`EXPIRES_AT`): the absolute UTC time the message expires, in
NServiceBus's timestamp format (`yyyy-MM-dd HH:mm:ss:ffffff Z`), appended last, for an
envelope with `expires_at` (a message the bridge originates: the record's timestamp plus the
time to live it was given). On read, `expires_at` comes from that header alone, which is
removed from the headers; one that does not parse means no expiry. The
`NServiceBus.TimeToBeReceived` header is carried exactly as the endpoint wrote it and is never
read: a record with only that header never expires. Error-queue and audit copies
(`NServiceBus.FailedQ`, `NServiceBus.ProcessingEnded`) never expire: no deadline is read or
written for them (`bridge.nservicebus.lifetime`). A deadline header an envelope already
carries is not written again: the header always says what `expires_at` says.

Delays: Kafka holds no delayed message. A producer asks for one with the record header
`NServiceBus.Bridge.DeliverAt` (`DELIVER_AT`): the time, ISO 8601 with a UTC offset or
NServiceBus's timestamp format, before which the message must not reach its destination. On
read it becomes the envelope's `deliver_at` and is removed; the destination delays the message
by its own means, or refuses it (`bridge.nservicebus.delays`). One that does not parse makes
the record poison: sent on at once, it could arrive early. The bridge never writes it, except
on the error-queue copy of a delayed message (`bridge.nservicebus.deadletter`): a record with
`NServiceBus.FailedQ` (an error copy) is never delayed, and the header stays on it as
information, so the copy reaches ServiceControl at once and a retry, which drops the failure
headers, asks for the delay again.

Read: headers come back in order with duplicates and nulls. A record without
`NServiceBus.MessageId` gets a deterministic one, uuid5 of `RECORD_ID_NAMESPACE` and
"topic/partition/offset", appended as that header, so a redelivered record keeps its id.
`native_id` is "topic/partition/offset". `read_records` reads a fetch of aiokafka
`ConsumerRecord`s into envelopes and poison.

Lossy, on purpose: the record key is not read back (on write it is derived from the headers);
a null record value (a tombstone) reads as an empty body; the deadline header keeps
microseconds. A header value that is not UTF-8 cannot become an NServiceBus header:
`incoming` raises `HeadersFormatError` and the source hands the record on as a `PoisonMessage`
(see `incoming_poison`), whose error-queue copy `deadletter.error_record` writes byte for byte
with the NServiceBus failure headers appended. A header name or value that cannot be encoded as
UTF-8 (a lone surrogate) raises `HeadersFormatError` from `outgoing`.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

from bridge.envelope import MESSAGE_ID, Envelope, Headers, PoisonMessage
from bridge.errors import ConfigError, HeadersFormatError
from bridge.nservicebus.delays import DELIVER_AT, parse_delivery_request
from bridge.nservicebus.lifetime import FAILED_Q, expires_at, never_expires
from bridge.nservicebus.wireformat import format_timestamp, timestamp_seconds

__all__ = [
    "DEFAULT_KEY",
    "DELIVER_AT",
    "EXPIRES_AT",
    "RECORD_ID_NAMESPACE",
    "Record",
    "RecordHeaders",
    "incoming",
    "incoming_poison",
    "key_header",
    "native_id",
    "outgoing",
    "read_records",
    "record_message_id",
]

DEFAULT_KEY = f"header:{MESSAGE_ID}"
#: The deadline header the bridge writes, as Kafka has no time to live of its own.
EXPIRES_AT = "NServiceBus.Bridge.ExpiresAt"

#: Fixed forever: changing it changes the id of every record that arrived without one.
RECORD_ID_NAMESPACE = uuid.UUID("8f5c2a4e-6b1d-5f7a-9c3e-0d4b8a6e2f17")

RecordHeaders = Sequence[tuple[str, bytes | None]]


class Record(NamedTuple):
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes | None]]
    timestamp_ms: int


def key_header(key_spec: str) -> str | None:
    """The header a key spec takes the record key from: `header:NAME` -> NAME, `none` -> None."""
    if key_spec == "none":
        return None
    name = key_spec.removeprefix("header:")
    if name == key_spec or not name:
        raise ConfigError(f"kafka: key must be `header:NAME` or `none`, got {key_spec!r}")
    return name


#: key_header per message, without parsing the spec again (a route has one or two specs).
_key_header = functools.lru_cache(maxsize=64)(key_header)


def native_id(topic: str, partition: int, offset: int) -> str:
    return f"{topic}/{partition}/{offset}"


def record_message_id(topic: str, partition: int, offset: int) -> str:
    """The id a record without `NServiceBus.MessageId` gets: the same on every redelivery."""
    return str(uuid.uuid5(RECORD_ID_NAMESPACE, native_id(topic, partition, offset)))


def outgoing(envelope: Envelope, key_spec: str, now: float) -> Record:
    """Lay `envelope` out as a Kafka record written at `now` (epoch seconds)."""
    headers = envelope.headers
    timestamp_ms = int(now * 1000)
    deadline = _deadline_text(expires_at(envelope, timestamp_ms / 1000))
    try:
        encoded = [
            (name, None if value is None else value.encode())
            for name, value in headers
            if name != EXPIRES_AT
        ]
        if deadline is not None:
            encoded.append((EXPIRES_AT, deadline.encode()))
        # The producer encodes names later, where a bad one would fail the whole batch.
        if not "".join(headers.names()).isascii():
            for name, _ in encoded:
                name.encode()
        key_name = _key_header(key_spec)
        key_value = None if key_name is None else headers.get(key_name)
        key = None if key_value is None else key_value.encode()
    except UnicodeEncodeError as exc:
        raise HeadersFormatError(f"a header is not encodable as UTF-8: {exc}") from exc
    return Record(key, envelope.body, encoded, timestamp_ms)


def _deadline_text(deadline: float | None) -> str | None:
    """The deadline header's value; None for no deadline or one no date can hold (never)."""
    if deadline is None:
        return None
    try:
        return format_timestamp(datetime.fromtimestamp(deadline, UTC))
    except (OverflowError, OSError, ValueError):  # past the year 9999
        return None


def incoming(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: RecordHeaders,
) -> Envelope:
    """The envelope a record carries; raise HeadersFormatError when a header is not UTF-8.
    The record's timestamp says nothing about its lifetime: it is not read."""
    where = native_id(topic, partition, offset)
    try:
        items = [(name, None if raw is None else raw.decode()) for name, raw in headers]
    except UnicodeDecodeError:
        for name, raw in headers:  # which one, for the reason
            try:
                None if raw is None else raw.decode()
            except UnicodeDecodeError as exc:
                reason = f"header {name!r} of record {where} is not UTF-8: {exc}"
                raise HeadersFormatError(reason) from exc
        raise
    last = dict(items)  # the last occurrence of each name, as Headers.get reads it
    deadline: float | None = None
    if EXPIRES_AT in last:
        if not never_expires(last):
            deadline = _deadline(last[EXPIRES_AT])
        items = [(name, text) for name, text in items if name != EXPIRES_AT]
    due: float | None = None
    if DELIVER_AT in last and FAILED_Q not in last:  # on an error copy: information only
        text = last[DELIVER_AT]
        try:
            due = parse_delivery_request(text or "")
        except ValueError:
            raise HeadersFormatError(
                f"header {DELIVER_AT} of record {where} is not a time: {text!r} (it takes "
                "ISO 8601 with a UTC offset, or NServiceBus's yyyy-MM-dd HH:mm:ss:ffffff Z)"
            ) from None
        items = [(name, text) for name, text in items if name != DELIVER_AT]
    if MESSAGE_ID not in last:
        items.append((MESSAGE_ID, record_message_id(topic, partition, offset)))
    return Envelope(
        headers=Headers.adopt(items),
        body=value or b"",
        expires_at=deadline,
        native_id=where,
        deliver_at=due,
    )


def _deadline(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return timestamp_seconds(text)
    except ValueError:
        return None


def incoming_poison(
    topic: str,
    partition: int,
    offset: int,
    value: bytes | None,
    headers: RecordHeaders,
    error: HeadersFormatError,
) -> PoisonMessage:
    """A record `incoming` refused, kept for the error queue.

    `raw_headers` is lossless: a JSON array of [name, value] pairs in record order, undecodable
    bytes written as the surrogate escapes of Python's `surrogateescape` (`\\udcff` for 0xff),
    null as null. `headers` is readable but lossy: undecodable bytes become U+FFFD; it gets the
    deterministic `NServiceBus.MessageId` like any record without one.
    """
    raw = [[name, None if v is None else v.decode(errors="surrogateescape")] for name, v in headers]
    readable = Headers(
        (name, None if v is None else v.decode(errors="replace")) for name, v in headers
    )
    if MESSAGE_ID not in readable:
        readable.add(MESSAGE_ID, record_message_id(topic, partition, offset))
    return PoisonMessage(
        raw_headers=json.dumps(raw),
        body=value or b"",
        reason=str(error),
        exception_type=type(error).__name__,
        native_id=native_id(topic, partition, offset),
        headers=readable,
    )


def read_records(records: Iterable[Any]) -> tuple[list[Envelope], list[tuple[Any, PoisonMessage]]]:
    """Split aiokafka `ConsumerRecord`s into envelopes and (record, poison) pairs, in order."""
    messages: list[Envelope] = []
    poison: list[tuple[Any, PoisonMessage]] = []
    for r in records:
        try:
            messages.append(incoming(r.topic, r.partition, r.offset, r.key, r.value, r.headers))
        except HeadersFormatError as exc:
            poison.append(
                (r, incoming_poison(r.topic, r.partition, r.offset, r.value, r.headers, exc))
            )
    return messages, poison
