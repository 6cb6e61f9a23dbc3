"""The SQL `Headers` column codec (wire-format §5), `encode` being the inverse of `decode`.

Written as current NServiceBus endpoints write it, byte for byte: a compact JSON object in
System.Text.Json's relaxed escaping, `/` as `\\/` (`headers_escapes` says which characters
become escapes, and how). Read: any standard JSON object whose values are strings or null,
with order and repeated names kept. An empty string or NULL column means no headers. Anything
else raises `HeadersFormatError`, which makes the row a poison message.

A row's own text crosses SQL to SQL: `read` keeps the column text with the headers it decoded,
and `write` gives that text back, unchanged, as long as the headers still hold exactly what it
says (`ColumnHeaders`); headers a rule, the row-Id fallback for a missing message id or
tracing changed are encoded afresh.

Lone surrogates: a JSON escape like `\\ud800` without its pair is valid (ASCII) JSON, but the
text it stands for has no UTF-8 form, so neither a PostgreSQL or SQLite column nor a Kafka or
AMQP header can carry it. `decode` refuses such a name or value (poison: the row moves to the
error queue unchanged) and `encode` refuses headers holding one (the sink rejects that message),
rather than failing inside the driver on every retry.

Speed: the common case of both directions goes through orjson behind the seam
`sql_headers_orjson` (`bridge.transports.sql.headers_orjson`); `encode_plain` and
`decode_plain` are the plain codec, which decides everything else (and words every error).
"""

from __future__ import annotations

import json
import re
from typing import cast

from bridge import speedups
from bridge.envelope import Headers
from bridge.errors import HeadersFormatError
from bridge.transports.sql import headers_orjson
from bridge.transports.sql.headers_escapes import quoted

__all__ = [
    "ColumnHeaders",
    "decode",
    "decode_fast",
    "decode_plain",
    "encode",
    "encode_fast",
    "encode_plain",
    "read",
    "write",
]

_SURROGATE = re.compile("[\ud800-\udfff]")


def encode_plain(headers: Headers) -> str:
    """Serialize to the JSON object text endpoints write (duplicates collapse, last wins);
    raise HeadersFormatError when a name or value holds a surrogate."""
    pairs = (
        f"{quoted(name)}:{'null' if value is None else quoted(value)}"
        for name, value in headers.to_dict().items()
    )
    return "{" + ",".join(pairs) + "}"


def encode_fast(headers: Headers) -> str:
    """`encode_plain`, through orjson where it can."""
    return headers_orjson.encoded(headers) or encode_plain(headers)


class JSONObject(list[tuple[str, object]]):
    """A JSON object as its (name, value) pairs in order, told apart from a JSON array."""


#: One decoder for every row (json.loads with a hook would build a new one per call).
_decoder = json.JSONDecoder(object_pairs_hook=JSONObject)


def decode_plain(text: str | bytes | None) -> Headers:
    """Parse the column; raise HeadersFormatError for anything that is not a flat object."""
    text = _column_text(text)
    return Headers() if text is None else _standard_decode(text)


def decode_fast(text: str | bytes | None) -> Headers:
    """`decode_plain`, through orjson where it can."""
    text = _column_text(text)
    if text is None:
        return Headers()
    pairs = headers_orjson.plain_pairs(text)
    if pairs is not None:
        return Headers.adopt(pairs)
    return _standard_decode(text)


def _column_text(text: str | bytes | None) -> str | None:
    """The column as text; None when it holds no headers (NULL, empty, blank)."""
    if text is None:
        return None
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise HeadersFormatError(f"headers are not valid UTF-8: {exc}") from exc
    if not text or text.isspace():
        return None
    return text


def _standard_decode(text: str) -> Headers:
    try:
        parsed = _decoder.decode(text)
    # ValueError, not only JSONDecodeError: a number past int_max_str_digits raises it.
    except (ValueError, RecursionError) as exc:
        raise HeadersFormatError(f"headers are not valid JSON: {exc}") from exc
    if not isinstance(parsed, JSONObject):
        raise HeadersFormatError(f"headers must be a JSON object, got {type(parsed).__name__}")
    for name, value in parsed:
        if value is not None and value.__class__ is not str:  # JSON makes no str subclasses
            raise HeadersFormatError(
                f"header {name!r} must be a string or null, got {type(value).__name__}"
            )
    if "\\u" in text:  # only an escape puts a surrogate into text that was decoded as UTF-8
        _refuse_lone_surrogates(cast(list[tuple[str, str | None]], parsed))
    return Headers(cast(list[tuple[str, str | None]], parsed))


def _refuse_lone_surrogates(pairs: list[tuple[str, str | None]]) -> None:
    # A valid escaped pair (`\\ud83d\\ude00`) is one character by now: what is left is lone.
    for name, value in pairs:
        for text in (name, value):
            if text is not None and not text.isascii() and _SURROGATE.search(text):
                raise HeadersFormatError(
                    f"header {name!r} holds a lone surrogate escape, which UTF-8 cannot carry"
                )


class ColumnHeaders(Headers):
    """Headers read from a Headers column, which remember that column's text."""

    __slots__ = ("_column", "_read")

    def __init__(self, items: list[tuple[str, str | None]], column: str) -> None:
        super().__init__(items)
        self._read = items  # what `column` says; never handed out, so never changed
        self._column = column

    def column_text(self) -> str | None:
        """The column text these headers were read from while they hold exactly what it says
        (every change goes through a method that replaces or appends to the items); None once
        they were changed."""
        return self._column if self._items == self._read else None


def read(column: str | bytes | None) -> Headers:
    """`decode`, keeping the column text for `write` (a source reading rows to forward)."""
    text = _column_text(column)
    if text is None:
        return Headers()
    return ColumnHeaders(decode(text).items(), text)


def write(headers: Headers) -> str:
    """The column text for `headers`: the text they were read from while they still hold
    exactly what it says (a row crossing SQL to SQL keeps its bytes), else `encode`."""
    if isinstance(headers, ColumnHeaders):
        text = headers.column_text()
        if text is not None:
            return text
    return encode(headers)


#: The codec: the orjson seam unless `BRIDGE_SPEEDUPS_OFF` names it (`bridge.speedups`).
encode, decode = (
    (encode_fast, decode_fast)
    if speedups.enabled(headers_orjson.SEAM)
    else (encode_plain, decode_plain)
)
