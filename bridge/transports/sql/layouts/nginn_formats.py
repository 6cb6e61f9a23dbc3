"""NGinn.MessageBus's text formats: the `k=v|k=v` headers, local times and `_NG-TTL`, the
`"$type"`-first JSON body, and the `sql://<alias>/<table>` endpoint of a table.

Facts (lafar6502/nginn-messagebus @1fa4baf, `NGinnBPM.MessageBus/`):
- Headers are `name=value` pairs joined by `|`, with no escaping: a name or value holding `|`
  or `=` is refused by the writer, and a pair that does not split into exactly two parts fails
  the reader; names and values are trimmed as read (Impl/IMessageTransport.cs:95-136).
- Six control headers live in columns and are not stored (`RemoveNGHeaders`,
  Impl/SqlQueue/CommonQueueOps.cs:243-258); `_NG-TTL` is the expiry as local time
  "yyyy-MM-dd HH:mm:ss" (Impl/MessageBus.cs:666).
- The body is Newtonsoft JSON with `"$type"` first (TypeNameHandling.Objects, nulls omitted:
  Impl/JsonMessageSerializer.cs:53-64).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from bridge.errors import HeadersFormatError

__all__ = [
    "COLUMN_HEADERS",
    "REPLY_TO",
    "TTL",
    "TTL_FORMAT",
    "endpoint",
    "format_headers",
    "local_text",
    "parse_headers",
    "parse_local",
    "to_utc",
    "utc_to_local",
    "with_type",
    "with_type_first",
]

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
#: `_NG-TTL` as NGinn writes it (MessageBus.cs:666).
TTL_FORMAT = "%Y-%m-%d %H:%M:%S"


def endpoint(alias: str, table: str) -> str:
    """The endpoint of table `table` on the connection NGinn names `alias`."""
    return f"sql://{alias}/{table}"


# -- headers -------------------------------------------------------------------------------------


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


# -- local times ---------------------------------------------------------------------------------


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


def to_utc(local: datetime, zone: ZoneInfo) -> datetime:
    """A naive local time in `zone` as an aware UTC time."""
    return local.replace(tzinfo=zone).astimezone(UTC)


def utc_to_local(utc: str, zone: ZoneInfo) -> datetime:
    """A UTC time as SQLite writes it (`YYYY-MM-DD HH:MM:SS.SSS`) as naive local time in `zone`."""
    return datetime.fromisoformat(utc).replace(tzinfo=UTC).astimezone(zone).replace(tzinfo=None)


# -- the body's "$type" --------------------------------------------------------------------------


def with_type(text: str, nginn_type: str) -> str:
    """`text` (a JSON object) with `"$type"` inserted as its first property, the rest as it was."""
    start = text.index("{") + 1
    rest = text[start:]
    member = f'"$type":{json.dumps(nginn_type)}'
    return text[:start] + member + ("" if rest.lstrip().startswith("}") else ",") + rest


def with_type_first(text: str, nginn_type: str) -> str:
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
