"""NGinn.MessageBus rows read -> envelopes: a receive's result rows (`received`), and the
envelope of a live row or the poison message of one NGinn could not read either (`incoming`).

Facts (lafar6502/nginn-messagebus @1fa4baf, `NGinnBPM.MessageBus/`):
- An expired row is committed as handled (Impl/SqlMessageTransport2.cs:748-756).

A row's own headers are kept (but `_NG-TTL`, which becomes the deadline, and `_NG-ReplyTo`);
the NServiceBus headers its columns say are added where it has none of its own, and the
`NGinn.*` headers say what the row is (this project's contract: README, "NGinn.MessageBus
tables").
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from bridge.envelope import MESSAGE_ID, TIME_SENT, Envelope, Headers, PoisonMessage
from bridge.errors import HeadersFormatError
from bridge.nservicebus.lifetime import never_expires
from bridge.nservicebus.wireformat import format_timestamp
from bridge.transports.sql.layouts.nginn_formats import (
    REPLY_TO,
    TTL,
    parse_headers,
    parse_local,
    to_utc,
)

__all__ = [
    "CORRELATION_ID",
    "ENCLOSED_TYPES",
    "NGINN_ID",
    "NGINN_LABEL",
    "NGINN_RETRY_COUNT",
    "NGINN_TO",
    "REPLY_TO_ADDRESS",
    "NGinnRow",
    "incoming",
    "received",
]

#: What a row's NServiceBus headers say of the row itself, with no NServiceBus equivalent.
NGINN_ID, NGINN_TO, NGINN_RETRY_COUNT, NGINN_LABEL = (
    "NGinn.Id",
    "NGinn.To",
    "NGinn.RetryCount",
    "NGinn.Label",
)

ENCLOSED_TYPES = "NServiceBus.EnclosedMessageTypes"
REPLY_TO_ADDRESS = "NServiceBus.ReplyToAddress"
CORRELATION_ID = "NServiceBus.CorrelationId"


@dataclass(frozen=True, slots=True)
class NGinnRow:
    """One row a receive took (and marked `X`), with the database's local time then."""

    native_id: str
    expired: bool
    from_endpoint: str
    to_endpoint: str
    retry_count: int
    insert_time: datetime
    retry_time: datetime
    correlation_id: str | None
    label: str | None
    body: bytes | str | None
    headers: bytes | str | None
    unique_id: str | None
    db_now: datetime


def received(rows: Sequence[Sequence[Any]]) -> list[NGinnRow]:
    """Result rows of the receive (see `nginn_sql`), oldest `retry_time` first."""
    taken = [_row(row) for row in rows]
    taken.sort(key=lambda row: (row.retry_time, int(row.native_id)))
    return taken


def _row(row: Sequence[Any]) -> NGinnRow:
    (
        id_,
        sender,
        to,
        retries,
        inserted,
        due,
        correlation,
        label,
        body,
        headers,
        unique,
        now,
    ) = row
    db_now = parse_local(now)
    return NGinnRow(
        native_id=str(id_),
        expired=_expired(headers, db_now),
        from_endpoint=str(sender or ""),
        to_endpoint=str(to or ""),
        retry_count=int(retries or 0),
        insert_time=parse_local(inserted),
        retry_time=parse_local(due),
        correlation_id=correlation,
        label=label,
        body=body,
        headers=headers,
        unique_id=unique,
        db_now=db_now,
    )


def _expired(headers: bytes | str | None, db_now: datetime) -> bool:
    """Whether the row's `_NG-TTL` is before the database's local time (unreadable: not)."""
    try:
        ttl = dict(parse_headers(_text(headers))).get(TTL)
        return ttl is not None and parse_local(ttl) < db_now
    except (HeadersFormatError, UnicodeDecodeError, ValueError):
        return False


def incoming(
    row: NGinnRow, now: float, endpoint: str, zone: ZoneInfo, type_names: Mapping[str, str]
) -> Envelope | PoisonMessage:
    """The envelope of a live row of the table whose endpoint is `endpoint` (`type_names`:
    NGinn's type name -> the NServiceBus one), or a poison message when NGinn could not read
    it either: headers its reader throws on, a body that is not UTF-8 JSON, a bad `_NG-TTL`."""
    try:
        pairs = parse_headers(_text(row.headers))
        text = _text(row.body)
        body = json.loads(text)
        given = dict(pairs)
        ttl = parse_local(given[TTL]) if TTL in given else None
    except (HeadersFormatError, UnicodeDecodeError, ValueError) as exc:
        return PoisonMessage(
            raw_headers=row.headers,
            body=row.body if isinstance(row.body, bytes) else _text(row.body).encode(),
            reason=f"NGinn row {row.native_id} cannot be read: {exc}",
            exception_type=type(exc).__name__,
            native_id=row.native_id,
            headers=_identity(row, endpoint, zone),
        )
    headers = Headers([(k, v) for k, v in pairs if k not in (TTL, REPLY_TO)])
    mapped = _mapped(row, given, body, endpoint, zone, type_names)
    for name, value in mapped:
        if value is not None and name not in headers:
            headers.add(name, value)
    for name, value in (
        (NGINN_ID, row.native_id),
        (NGINN_TO, row.to_endpoint),
        (NGINN_RETRY_COUNT, str(row.retry_count)),
        (NGINN_LABEL, row.label),
    ):
        headers.set(name, value)
    deadline = None
    if ttl is not None and not never_expires(headers):
        deadline = now + (to_utc(ttl, zone) - to_utc(row.db_now, zone)).total_seconds()
    return Envelope(headers, text.encode("utf-8"), expires_at=deadline, native_id=row.native_id)


def _identity(row: NGinnRow, endpoint: str, zone: ZoneInfo) -> Headers:
    """What a row's columns say of it, for a row whose headers or body cannot be read: the
    error-queue copy keeps its identity (its raw headers go along as they were)."""
    headers = Headers()
    for name, value in (
        (MESSAGE_ID, _message_id(row, endpoint)),
        (CORRELATION_ID, row.correlation_id or None),
        (REPLY_TO_ADDRESS, row.from_endpoint or None),
        ("NServiceBus.OriginatingEndpoint", row.from_endpoint or None),
        (TIME_SENT, format_timestamp(to_utc(row.insert_time, zone))),
        (NGINN_ID, row.native_id),
        (NGINN_TO, row.to_endpoint),
        (NGINN_RETRY_COUNT, str(row.retry_count)),
        (NGINN_LABEL, row.label),
    ):
        if value is not None:
            headers.add(name, value)
    return headers


def _message_id(row: NGinnRow, endpoint: str) -> str:
    return row.unique_id or str(uuid.uuid5(uuid.NAMESPACE_URL, f"{endpoint}#{row.native_id}"))


def _mapped(
    row: NGinnRow,
    given: Mapping[str, str],
    body: object,
    endpoint: str,
    zone: ZoneInfo,
    type_names: Mapping[str, str],
) -> list[tuple[str, str | None]]:
    message_id = _message_id(row, endpoint)
    type_name = body.get("$type") if isinstance(body, dict) else None
    enclosed = type_names.get(type_name, type_name) if isinstance(type_name, str) else None
    return [
        (MESSAGE_ID, message_id),
        (CORRELATION_ID, row.correlation_id or None),
        (REPLY_TO_ADDRESS, given.get(REPLY_TO) or row.from_endpoint or None),
        ("NServiceBus.OriginatingEndpoint", row.from_endpoint or None),
        (ENCLOSED_TYPES, enclosed),
        ("NServiceBus.ContentType", "application/json"),
        (TIME_SENT, format_timestamp(to_utc(row.insert_time, zone))),
        ("NServiceBus.MessageIntent", "Send"),
    ]


def _text(value: bytes | str | None) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")  # UnicodeDecodeError: the caller's poison
    return value or ""
