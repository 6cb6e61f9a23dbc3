"""NGinn.MessageBus rows <-> envelopes: the `k=v|k=v` headers, the JSON body, local times.

Facts (lafar6502/nginn-messagebus @1fa4baf, `NGinnBPM.MessageBus/`):
- Headers are `name=value` pairs joined by `|`, with no escaping: a name or value holding `|`
  or `=` is refused by the writer, and a pair that does not split into exactly two parts fails
  the reader; names and values are trimmed as read (Impl/IMessageTransport.cs:95-136).
- Six control headers live in columns and are not stored (`RemoveNGHeaders`,
  Impl/SqlQueue/CommonQueueOps.cs:243-258); `_NG-TTL` is the expiry as local time
  "yyyy-MM-dd HH:mm:ss" (Impl/MessageBus.cs:666), and an expired row is committed as handled
  (Impl/SqlMessageTransport2.cs:748-756).
- The body is Newtonsoft JSON with `"$type"` first (TypeNameHandling.Objects, nulls omitted:
  Impl/JsonMessageSerializer.cs:53-64).

The mapping to NServiceBus headers is this project's contract (README, "NGinn.MessageBus
tables"): `incoming` makes an envelope of a row, `outgoing` a row of an envelope.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo

from bridge.envelope import MESSAGE_ID, TIME_SENT, Envelope, Headers, PoisonMessage
from bridge.errors import HeadersFormatError
from bridge.nservicebus.lifetime import FAILED_Q, never_expires, time_to_live_ms
from bridge.nservicebus.wireformat import format_timestamp

__all__ = [
    "COLUMN_HEADERS",
    "LEFT_OUT",
    "TTL",
    "NGinnRow",
    "OutgoingNGinnRow",
    "RowMapping",
    "format_headers",
    "local_text",
    "parse_headers",
    "parse_local",
    "utc_to_local",
]

log = logging.getLogger(__name__)

TTL = "_NG-TTL"
REPLY_TO = "_NG-ReplyTo"
#: The control headers NGinn keeps in columns, never in `msg_headers` (CommonQueueOps.cs:249-254).
COLUMN_HEADERS = frozenset(
    {
        "_NG-BusMessageId",
        "_NG-ContentType",
        "_NG-CorrelationId",
        "_NG-DeliverAt",
        "_NG-Label",
        "_NG_RetryCount",
    }
)
#: What a row's NServiceBus headers say of the row itself, with no NServiceBus equivalent.
NGINN_ID, NGINN_TO, NGINN_RETRY_COUNT, NGINN_LABEL = (
    "NGinn.Id",
    "NGinn.To",
    "NGinn.RetryCount",
    "NGinn.Label",
)
#: On a row the bridge wrote: how many headers it left out (NGinn cannot carry them).
LEFT_OUT = "NGinn.HeadersLeftOut"
_OWN = frozenset({NGINN_ID, NGINN_TO, NGINN_RETRY_COUNT, NGINN_LABEL, LEFT_OUT})

ENCLOSED_TYPES = "NServiceBus.EnclosedMessageTypes"
REPLY_TO_ADDRESS = "NServiceBus.ReplyToAddress"
CORRELATION_ID = "NServiceBus.CorrelationId"
EXCEPTION_MESSAGE = "NServiceBus.ExceptionInfo.Message"
#: NGinn's column widths (createmqueue.sqlserver.sql:5-17).
ENDPOINT_CHARS, CORRELATION_CHARS, LABEL_CHARS, UNIQUE_ID_CHARS = 50, 100, 100, 40
#: `_NG-TTL` as NGinn writes it (MessageBus.cs:666).
TTL_FORMAT = "%Y-%m-%d %H:%M:%S"


def parse_headers(text: str | None) -> list[tuple[str, str]]:
    """`msg_headers` as NGinn's reader takes it: HeadersFormatError where that reader throws."""
    out: dict[str, str] = {}
    for pair in (text or "").split("|"):
        if not pair:
            continue
        parts = pair.split("=")
        if len(parts) != 2:
            raise HeadersFormatError(f"invalid NGinn header string: {pair[:80]!r}")
        out[parts[0].strip()] = parts[1].strip()
    return list(out.items())


def format_headers(headers: Sequence[tuple[str, str | None]]) -> tuple[str, list[str]]:
    """(`msg_headers` text, names left out): every pair NGinn's reader gives back as it was
    given; a null value, `|` or `=` anywhere, or spaces it would trim, are left out."""
    kept: dict[str, str] = {}
    left_out: list[str] = []
    for name, value in headers:
        if value is None or not _carried(name) or (value and not _carried(value)):
            left_out.append(name)
            kept.pop(name, None)
            continue
        kept.pop(name, None)  # the last of a name wins, in its own place, as a reader keeps it
        kept[name] = value
    return "|".join(f"{name}={value}" for name, value in kept.items()), left_out


def _carried(text: str) -> bool:
    return bool(text) and "|" not in text and "=" not in text and text == text.strip()


def parse_local(value: object) -> datetime:
    """A time column (or `_NG-TTL`) as a naive local datetime: drivers return datetime
    (psycopg, pyodbc) or ISO text (SQLite)."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=None)
    if isinstance(value, bytes):
        value = value.decode("ascii")
    if isinstance(value, str):
        return datetime.fromisoformat(value.strip()).replace(tzinfo=None)
    raise ValueError(f"not a time: {value!r}")


def local_text(moment: datetime) -> str:
    """A naive local time as SQLite's NGinn tables hold it (`YYYY-MM-DD HH:MM:SS.fff`)."""
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


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


class OutgoingNGinnRow(NamedTuple):
    """The parameters of the layout's send, in its order."""

    from_endpoint: str
    to_endpoint: str
    error_info: str | None
    msg_text: str
    correlation_id: str | None
    label: str | None
    headers: str
    unique_id: str | None


def _text(value: bytes | str | None) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")  # UnicodeDecodeError: the caller's poison
    return value or ""


class RowMapping:
    """The mapping of one connection: its alias, time zone and type map."""

    def __init__(self, alias: str, zone: str, types: Mapping[str, str]) -> None:
        self.alias = alias
        self.zone = ZoneInfo(zone)
        self.types = dict(types)
        self._type_names = {nginn: name for name, nginn in types.items()}
        #: Headers left out of rows written so far (NGinn could not carry them).
        self.left_out = 0
        self._warned: set[str] = set()

    def endpoint(self, table: str) -> str:
        return f"sql://{self.alias}/{table}"

    def to_utc(self, local: datetime) -> datetime:
        return local.replace(tzinfo=self.zone).astimezone(UTC)

    # -- rows read -------------------------------------------------------------------------------

    def received(self, rows: Sequence[Sequence[Any]]) -> list[NGinnRow]:
        """Result rows of the receive (see `nginn_sql`), oldest `retry_time` first."""
        taken = [self._row(row) for row in rows]
        taken.sort(key=lambda row: (row.retry_time, int(row.native_id)))
        return taken

    def _row(self, row: Sequence[Any]) -> NGinnRow:
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

    def incoming(self, row: NGinnRow, now: float, table: str) -> Envelope | PoisonMessage:
        """The envelope of a live row, or a poison message when NGinn could not read it
        either: headers its reader throws on, a body that is not UTF-8 JSON, a bad `_NG-TTL`."""
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
                headers=self._identity(row, table),
            )
        headers = Headers([(k, v) for k, v in pairs if k not in (TTL, REPLY_TO)])
        mapped = self._mapped(row, given, body, table)
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
            deadline = now + (self.to_utc(ttl) - self.to_utc(row.db_now)).total_seconds()
        return Envelope(headers, text.encode("utf-8"), expires_at=deadline, native_id=row.native_id)

    def _identity(self, row: NGinnRow, table: str) -> Headers:
        """What a row's columns say of it, for a row whose headers or body cannot be read: the
        error-queue copy keeps its identity (its raw headers go along as they were)."""
        headers = Headers()
        for name, value in (
            (MESSAGE_ID, self._message_id(row, table)),
            (CORRELATION_ID, row.correlation_id or None),
            (REPLY_TO_ADDRESS, row.from_endpoint or None),
            ("NServiceBus.OriginatingEndpoint", row.from_endpoint or None),
            (TIME_SENT, format_timestamp(self.to_utc(row.insert_time))),
            (NGINN_ID, row.native_id),
            (NGINN_TO, row.to_endpoint),
            (NGINN_RETRY_COUNT, str(row.retry_count)),
            (NGINN_LABEL, row.label),
        ):
            if value is not None:
                headers.add(name, value)
        return headers

    def _message_id(self, row: NGinnRow, table: str) -> str:
        return row.unique_id or str(
            uuid.uuid5(uuid.NAMESPACE_URL, f"{self.endpoint(table)}#{row.native_id}")
        )

    def _mapped(
        self, row: NGinnRow, given: Mapping[str, str], body: object, table: str
    ) -> list[tuple[str, str | None]]:
        message_id = self._message_id(row, table)
        type_name = body.get("$type") if isinstance(body, dict) else None
        enclosed = (
            self._type_names.get(type_name, type_name) if isinstance(type_name, str) else None
        )
        return [
            (MESSAGE_ID, message_id),
            (CORRELATION_ID, row.correlation_id or None),
            (REPLY_TO_ADDRESS, given.get(REPLY_TO) or row.from_endpoint or None),
            ("NServiceBus.OriginatingEndpoint", row.from_endpoint or None),
            (ENCLOSED_TYPES, enclosed),
            ("NServiceBus.ContentType", "application/json"),
            (TIME_SENT, format_timestamp(self.to_utc(row.insert_time))),
            ("NServiceBus.MessageIntent", "Send"),
        ]

    # -- rows written ----------------------------------------------------------------------------

    def outgoing(self, envelope: Envelope, now: float, table: str) -> OutgoingNGinnRow:
        """The row for `envelope` in table `table`; HeadersFormatError for a message NGinn
        could not take (the sink rejects it: it goes to the error queue)."""
        headers = envelope.headers
        unique_id = headers.get(MESSAGE_ID) or None
        if unique_id is not None and len(unique_id) > UNIQUE_ID_CHARS:
            raise HeadersFormatError(
                f"NServiceBus.MessageId {unique_id[:60]!r} is longer than NGinn's unique_id "
                f"({UNIQUE_ID_CHARS} characters)"
            )
        correlation = headers.get(CORRELATION_ID) or None
        if correlation is not None and len(correlation) > CORRELATION_CHARS:
            raise HeadersFormatError(
                f"NServiceBus.CorrelationId is longer than NGinn's correlation_id "
                f"({CORRELATION_CHARS} characters)"
            )
        enclosed = _enclosed_names(headers.get(ENCLOSED_TYPES))
        type_name = enclosed[0] if enclosed else None
        copy = FAILED_Q in headers
        text = self._body(envelope.body, enclosed, copy)
        # what a row says of itself is the new row's, except on an error-queue copy, where it
        # names the row that failed
        own = {LEFT_OUT} if copy else _OWN
        pairs = [
            (k, v)
            for k, v in headers
            if k not in COLUMN_HEADERS and k not in own and k not in (TTL, REPLY_TO)
        ]
        lifetime = time_to_live_ms(envelope, now)
        if lifetime is not None:
            expires = datetime.fromtimestamp(now + lifetime / 1000, self.zone)
            pairs.append((TTL, expires.strftime(TTL_FORMAT)))
        written, left_out = format_headers(pairs)
        error_info = headers.get(EXCEPTION_MESSAGE) if copy else None
        if left_out:
            counted = f"{LEFT_OUT}={len(left_out)}"
            written = f"{written}|{counted}" if written else counted
            self._count(left_out)
            if copy:  # nothing of an error-queue copy is lost: kept after the exception message
                kept = {name: value for name, value in pairs if name in set(left_out)}
                error_info = f"{error_info or ''}\n\n{LEFT_OUT}: {json.dumps(kept)}"
        return OutgoingNGinnRow(
            from_endpoint=self._sender(headers.get(REPLY_TO_ADDRESS)),
            to_endpoint=self.endpoint(table),
            error_info=error_info,
            msg_text=text,
            correlation_id=correlation,
            label=(type_name or "")[:LABEL_CHARS] or None,
            headers=written,
            unique_id=unique_id,
        )

    def _body(self, body: bytes, enclosed: Sequence[str], copy: bool) -> str:
        """The body as NGinn reads it: UTF-8 JSON with `"$type"` its first property, which is
        where Json.NET, with the default MetadataPropertyHandling NGinn leaves it at, looks for
        it. The `$type` is, in this order: the type map's entry of the message's own (first
        enclosed) type (NServiceBus's own `$type`, an assembly-qualified name NGinn's process
        cannot load, is replaced); the body's own, moved first (a row NGinn wrote names the
        exact class, which a base's entry would narrow); the entry of the first of its other
        enclosed types (most derived first) that has one: a derived event whose base alone is
        mapped goes as the base, the class an NGinn subscriber of the base can load, as
        NServiceBus bodies carry no `$type`. The other members are kept as written.
        An error-queue copy is written as it is (it is not for a handler). A UTF-8 byte order
        mark, which NServiceBus's JSON serializers write, is not kept: NGinn reads `msg_text`
        as a string, and JSON has none."""
        if copy:
            return body.decode("utf-8-sig", errors="replace")
        try:
            text = body.decode("utf-8-sig")
            parsed = json.loads(text)
        except (UnicodeDecodeError, ValueError) as exc:
            raise HeadersFormatError(
                f"the body is not UTF-8 JSON, which NGinn needs: {exc}"
            ) from exc
        if not isinstance(parsed, dict):
            raise HeadersFormatError("the body is not a JSON object, which NGinn needs")
        own = parsed.get("$type")
        mapped = [self.types[name] for name in enclosed if name in self.types]
        exact = self.types.get(enclosed[0]) if enclosed else None
        nginn_type = exact or (own if isinstance(own, str) else None) or next(iter(mapped), None)
        if nginn_type is None:
            named = ", ".join(repr(name) for name in enclosed) or "none"
            raise HeadersFormatError(
                f"no `nginn.types` entry for any of the message's types ({named}) and no $type "
                "in its body: NGinn dispatches on the body's $type"
            )
        if "$type" not in parsed:
            return _with_type(text, nginn_type)
        if own == nginn_type and next(iter(parsed)) == "$type":
            return text
        return _with_type_first(text, nginn_type)

    def _sender(self, reply_to: str | None) -> str:
        """`from_endpoint`: `sql://<alias>/<the reply queue's table>`, else `.../bridge`."""
        table = _table_of(reply_to) if reply_to else ""
        endpoint = self.endpoint(table) if table else ""
        if reply_to and reply_to.startswith("sql://"):
            endpoint = reply_to
        if not endpoint or len(endpoint) > ENDPOINT_CHARS:
            endpoint = self.endpoint("bridge")
        return endpoint

    def _count(self, names: list[str]) -> None:
        self.left_out += len(names)
        new = [name for name in names if name not in self._warned]
        if new:
            self._warned.update(new)
            log.warning(
                "NGinn rows cannot carry header(s) %s (a `|` or `=`, a null value or padding "
                "spaces): left out, and counted in each row's %s header",
                ", ".join(sorted(set(new))),
                LEFT_OUT,
            )


def _expired(headers: bytes | str | None, db_now: datetime) -> bool:
    """Whether the row's `_NG-TTL` is before the database's local time (unreadable: not)."""
    try:
        ttl = dict(parse_headers(_text(headers))).get(TTL)
        return ttl is not None and parse_local(ttl) < db_now
    except (HeadersFormatError, UnicodeDecodeError, ValueError):
        return False


def _enclosed_names(enclosed: str | None) -> list[str]:
    """The full names of the enclosed types, most derived first (`Ns.Type, Asm,
    Version=...;Ns.Base, Asm` -> `Ns.Type`, `Ns.Base`)."""
    names: list[str] = []
    for entry in (enclosed or "").split(";"):
        name = entry.split(",", 1)[0].strip()
        if name and name not in names:
            names.append(name)
    return names


def _with_type(text: str, nginn_type: str) -> str:
    """`text` (a JSON object) with `"$type"` inserted as its first property, the rest as it was."""
    start = text.index("{") + 1
    rest = text[start:]
    member = f'"$type":{json.dumps(nginn_type)}'
    return text[:start] + member + ("" if rest.lstrip().startswith("}") else ",") + rest


def _with_type_first(text: str, nginn_type: str) -> str:
    """`text` (a JSON object holding `"$type"`) with `"$type": nginn_type` its first property
    and every other member as it was written (numbers keep their digits)."""
    decoder = json.JSONDecoder()
    members: list[str] = []
    index = text.index("{") + 1
    while True:
        index = _skip_space(text, index)
        if text[index] == "}":
            break
        key_at = index
        key, end = decoder.raw_decode(text, key_at)
        value_at = _skip_space(text, _skip_space(text, end) + 1)  # past the `:`
        _, index = decoder.raw_decode(text, value_at)
        if key != "$type":
            members.append(f"{text[key_at:end]}:{text[value_at:index]}")
        index = _skip_space(text, index)
        if text[index] == ",":
            index += 1
    first = f'"$type":{json.dumps(nginn_type)}'
    return "{" + ",".join([first, *members]) + "}"


def _skip_space(text: str, index: int) -> int:
    while text[index] in " \t\r\n":
        index += 1
    return index


def _table_of(address: str) -> str:
    """The queue name in an address: `Sales@[dbo]@[db]`, `"public"."Sales"`, `Sales`."""
    if address.startswith("sql://"):
        return address.rsplit("/", 1)[-1]
    if "@" in address:
        return address.split("@", 1)[0].strip("[]")
    if address.endswith('"') and '"."' in address:
        return address.rsplit('"."', 1)[1][:-1].replace('""', '"')
    return address


def utc_to_local(utc: str, zone: ZoneInfo) -> datetime:
    """A UTC time as SQLite writes it (`YYYY-MM-DD HH:MM:SS.SSS`) as naive local time in `zone`."""
    return datetime.fromisoformat(utc).replace(tzinfo=UTC).astimezone(zone).replace(tzinfo=None)
