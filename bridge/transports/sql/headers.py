"""The SQL `Headers` column codec (wire-format §5), `encode` being the inverse of `decode`.

Written as current NServiceBus endpoints write it: a compact JSON object, `/` escaped as `\\/`,
non-ASCII characters raw. Read: any standard JSON object whose values are strings or null, with
order and repeated names kept. An empty string or NULL column means no headers. Anything else
raises `HeadersFormatError`, which makes the row a poison message.

Lone surrogates: a JSON escape like `\\ud800` without its pair is valid (ASCII) JSON, but the
text it stands for has no UTF-8 form, so neither a PostgreSQL or SQLite column nor a Kafka or
AMQP header can carry it. `decode` refuses such a name or value (poison: the row moves to the
error queue unchanged) and `encode` refuses headers holding one (the sink rejects that message),
rather than failing inside the driver on every retry.

Speed: both directions run once per message, so the common case goes through orjson (about
3x faster than the standard library here). Its result is only taken where it is provably what
the standard library would give: on decode, a flat object with no repeated name and no escaped
quote; on encode, text orjson can encode at all. Everything else (and every error message)
takes the standard library path.
"""

from __future__ import annotations

import json
import re
from typing import cast

import orjson

from bridge.envelope import Headers
from bridge.errors import HeadersFormatError

__all__ = ["decode", "encode"]

_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_SURROGATE = re.compile("[\ud800-\udfff]")


def encode(headers: Headers) -> str:
    """Serialize to the JSON object text endpoints write (duplicates collapse, last wins);
    raise HeadersFormatError when a name or value holds a lone surrogate."""
    try:
        # orjson writes what _encoder writes (a test holds them to it) and refuses a surrogate.
        return orjson.dumps(headers.to_dict()).decode().replace("/", "\\/")
    except TypeError:
        return _standard_encode(headers)


def _standard_encode(headers: Headers) -> str:
    text = _encoder.encode(headers.to_dict()).replace("/", "\\/")
    if not text.isascii():  # only non-ASCII text can hold a surrogate
        try:
            text.encode("utf-8")  # ~4x faster than a regex search for the surrogate range
        except UnicodeEncodeError as exc:
            raise HeadersFormatError(f"a header is not encodable as UTF-8: {exc}") from exc
    return text


class JSONObject(list[tuple[str, object]]):
    """A JSON object as its (name, value) pairs in order, told apart from a JSON array."""


#: One decoder for every row (json.loads with a hook would build a new one per call).
_decoder = json.JSONDecoder(object_pairs_hook=JSONObject)


def decode(text: str | bytes | None) -> Headers:
    """Parse the column; raise HeadersFormatError for anything that is not a flat object."""
    if text is None:
        return Headers()
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise HeadersFormatError(f"headers are not valid UTF-8: {exc}") from exc
    if not text or text.isspace():
        return Headers()
    pairs = _plain_pairs(text)
    if pairs is not None:
        return Headers.adopt(pairs)
    return _standard_decode(text)


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


def _plain_pairs(text: str) -> list[tuple[str, str | None]] | None:
    """The pairs of `text` when it is a flat object of strings and nulls with no name repeated,
    parsed by orjson; None for anything else (the standard decoder then decides).

    orjson returns a dict, which would silently keep only the last of a repeated name. That is
    ruled out by counting `"`: a text holds 2 x (the strings in it) + (its escaped quotes) of
    them, and the strings in it are the dict's names and string values plus, for each repeated
    name, at least that name again. So the count is exactly 2 x (the dict's names and string
    values) only for a text with no repeated name (and no escaped quote, which the standard
    decoder then reads). orjson refuses what the standard decoder would accept or read
    differently (lone surrogate escapes, NaN, huge numbers, a BOM): None.
    """
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if parsed.__class__ is not dict:
        return None
    strings = len(parsed)
    for value in parsed.values():
        if value is not None:
            if value.__class__ is not str:
                return None
            strings += 1
    if text.count('"') != 2 * strings:
        return None
    return list(parsed.items())


def _refuse_lone_surrogates(pairs: list[tuple[str, str | None]]) -> None:
    # A valid escaped pair (`\\ud83d\\ude00`) is one character by now: what is left is lone.
    for name, value in pairs:
        for text in (name, value):
            if text is not None and not text.isascii() and _SURROGATE.search(text):
                raise HeadersFormatError(
                    f"header {name!r} holds a lone surrogate escape, which UTF-8 cannot carry"
                )
