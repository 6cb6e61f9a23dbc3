"""The speed-up seam `sql_headers_orjson`: the Headers column codec's common case through orjson.

Why: both directions run once per message sent or received, and orjson does the common case
several times faster than the plain codec (the standard library's decoder, and an encoder that
escapes in Python as NServiceBus does). Bench: `bench/speedups.py sql_headers_orjson`.
Equivalence: `tests/unit/test_sql_headers_orjson.py` (fast and plain give the same text, the
same Headers, the same refusals). `bridge.transports.sql.headers` picks it once at import
unless `BRIDGE_SPEEDUPS_OFF` names it; each function here answers only where its result is
provably the plain codec's, and None otherwise (the plain codec then decides).
"""

from __future__ import annotations

import orjson

from bridge.envelope import Headers
from bridge.transports.sql.headers_escapes import BEYOND_JSON

__all__ = ["SEAM", "encoded", "plain_pairs"]

SEAM = "sql_headers_orjson"


def encoded(headers: Headers) -> str | None:
    """The column text the plain encoder writes; None where orjson's text is not it.

    orjson escapes `"`, `\\` and U+0000..U+001F as NServiceBus does, but for the hex case of
    `\\u001F` and the like, and writes raw what NServiceBus escapes beyond them (DEL, C1,
    U+00A0, characters outside the BMP, ...: `headers_escapes.BEYOND_JSON`). A text with either
    is left to the plain encoder, and so is a surrogate, which orjson refuses (the plain encoder
    then refuses it with its own message). What is left differs only in `/`.
    """
    try:
        text = orjson.dumps(headers.to_dict()).decode()
    except TypeError:
        return None
    if "\\u" in text or "\x7f" in text or (not text.isascii() and BEYOND_JSON.search(text)):
        return None
    return text.replace("/", "\\/")


def plain_pairs(text: str) -> list[tuple[str, str | None]] | None:
    """The pairs of `text` when it is a flat object of strings and nulls with no name repeated;
    None for anything else.

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
