"""Envelopes -> NGinn.MessageBus rows: the parameters of the layout's send (`outgoing`), with
the names of the headers the row could not carry, or HeadersFormatError for a message NGinn
could not take.

The columns come from the NServiceBus headers (this project's contract: README,
"NGinn.MessageBus tables"), within NGinn's column widths; the other headers go into
`msg_headers` as far as NGinn can carry them, with `_NG-TTL` for a message that expires, and the
body gets the `"$type"` NGinn dispatches on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import NamedTuple
from zoneinfo import ZoneInfo

from bridge.envelope import MESSAGE_ID, Envelope
from bridge.errors import HeadersFormatError
from bridge.nservicebus.lifetime import FAILED_Q, time_to_live_ms
from bridge.transports.sql.layouts.nginn_formats import (
    COLUMN_HEADERS,
    REPLY_TO,
    TTL,
    TTL_FORMAT,
    endpoint,
    format_headers,
    with_type,
    with_type_first,
)
from bridge.transports.sql.layouts.nginn_incoming import (
    CORRELATION_ID,
    ENCLOSED_TYPES,
    NGINN_ID,
    NGINN_LABEL,
    NGINN_RETRY_COUNT,
    NGINN_TO,
    REPLY_TO_ADDRESS,
)

__all__ = ["LEFT_OUT", "OutgoingNGinnRow", "outgoing"]

#: On a row the bridge wrote: how many headers it left out (NGinn cannot carry them).
LEFT_OUT = "NGinn.HeadersLeftOut"
_OWN = frozenset({NGINN_ID, NGINN_TO, NGINN_RETRY_COUNT, NGINN_LABEL, LEFT_OUT})

EXCEPTION_MESSAGE = "NServiceBus.ExceptionInfo.Message"
#: NGinn's column widths (createmqueue.sqlserver.sql:5-17).
ENDPOINT_CHARS, CORRELATION_CHARS, LABEL_CHARS, UNIQUE_ID_CHARS = 50, 100, 100, 40


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


def outgoing(
    envelope: Envelope,
    now: float,
    table: str,
    *,
    alias: str,
    zone: ZoneInfo,
    types: Mapping[str, str],
) -> tuple[OutgoingNGinnRow, list[str]]:
    """(the row for `envelope` in table `table` of connection `alias`, the names of the headers
    left out of it); HeadersFormatError for a message NGinn could not take (the sink rejects
    it: it goes to the error queue)."""
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
    text = _body(envelope.body, enclosed, copy, types)
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
        expires = datetime.fromtimestamp(now + lifetime / 1000, zone)
        pairs.append((TTL, expires.strftime(TTL_FORMAT)))
    written, left_out = format_headers(pairs)
    error_info = headers.get(EXCEPTION_MESSAGE) if copy else None
    if left_out:
        counted = f"{LEFT_OUT}={len(left_out)}"
        written = f"{written}|{counted}" if written else counted
        if copy:  # nothing of an error-queue copy is lost: kept after the exception message
            kept = {name: value for name, value in pairs if name in set(left_out)}
            error_info = f"{error_info or ''}\n\n{LEFT_OUT}: {json.dumps(kept)}"
    row = OutgoingNGinnRow(
        from_endpoint=_sender(alias, headers.get(REPLY_TO_ADDRESS)),
        to_endpoint=endpoint(alias, table),
        error_info=error_info,
        msg_text=text,
        correlation_id=correlation,
        label=(type_name or "")[:LABEL_CHARS] or None,
        headers=written,
        unique_id=unique_id,
    )
    return row, left_out


def _body(body: bytes, enclosed: Sequence[str], copy: bool, types: Mapping[str, str]) -> str:
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
        raise HeadersFormatError(f"the body is not UTF-8 JSON, which NGinn needs: {exc}") from exc
    if not isinstance(parsed, dict):
        raise HeadersFormatError("the body is not a JSON object, which NGinn needs")
    own = parsed.get("$type")
    mapped = [types[name] for name in enclosed if name in types]
    exact = types.get(enclosed[0]) if enclosed else None
    nginn_type = exact or (own if isinstance(own, str) else None) or next(iter(mapped), None)
    if nginn_type is None:
        named = ", ".join(repr(name) for name in enclosed) or "none"
        raise HeadersFormatError(
            f"no `nginn.types` entry for any of the message's types ({named}) and no $type "
            "in its body: NGinn dispatches on the body's $type"
        )
    if "$type" not in parsed:
        return with_type(text, nginn_type)
    if own == nginn_type and next(iter(parsed)) == "$type":
        return text
    return with_type_first(text, nginn_type)


def _sender(alias: str, reply_to: str | None) -> str:
    """`from_endpoint`: `sql://<alias>/<the reply queue's table>`, else `.../bridge`."""
    table = _table_of(reply_to) if reply_to else ""
    sender = endpoint(alias, table) if table else ""
    if reply_to and reply_to.startswith("sql://"):
        sender = reply_to
    if not sender or len(sender) > ENDPOINT_CHARS:
        sender = endpoint(alias, "bridge")
    return sender


def _enclosed_names(enclosed: str | None) -> list[str]:
    """The full names of the enclosed types, most derived first (`Ns.Type, Asm,
    Version=...;Ns.Base, Asm` -> `Ns.Type`, `Ns.Base`)."""
    names: list[str] = []
    for entry in (enclosed or "").split(";"):
        name = entry.split(",", 1)[0].strip()
        if name and name not in names:
            names.append(name)
    return names


def _table_of(address: str) -> str:
    """The queue name in an address: `Sales@[dbo]@[db]`, `"public"."Sales"`, `Sales`."""
    if address.startswith("sql://"):
        return address.rsplit("/", 1)[-1]
    if "@" in address:
        return address.split("@", 1)[0].strip("[]")
    if address.endswith('"') and '"."' in address:
        return address.rsplit('"."', 1)[1][:-1].replace('""', '"')
    return address
