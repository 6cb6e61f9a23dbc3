"""Messages with every kind of header and body the bulk jobs must carry unchanged, and raw
access to the tables and topics they land in (not through the code under test)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg

from bridge.envelope import Envelope, Headers
from bridge.nservicebus.deadletter import RAW_HEADERS
from bridge.transports.sql import headers as sql_headers

REPLY_TO = '"public"."Replies"'


def message(n: int, *, ttl: float | None = None, kind: str = "Shop.OrderPlaced") -> Envelope:
    """Message number `n`: headers in a fixed order with nulls, empties, `/` and non-ASCII,
    and a body of 0-2000 bytes of every byte value."""
    headers = Headers(
        [
            ("NServiceBus.MessageId", str(uuid.UUID(int=n + 1))),
            ("NServiceBus.MessageIntent", "Publish" if n % 3 == 0 else "Send"),
            ("NServiceBus.EnclosedMessageTypes", f"{kind}, Shop.Messages, Version=1.0.0.0"),
            ("NServiceBus.OriginatingEndpoint", f"Endpoint{n % 2}"),
            ("NServiceBus.TimeSent", "2026-04-29 21:56:55:590807 Z"),
            ("NServiceBus.ReplyToAddress", REPLY_TO),
            ("Text", f'zwölf ✓ {n} a/b \\ "q"'),
            ("Empty", ""),
            ("Null", None),
        ]
    )
    body = b"".join(hashlib.sha256(f"{n}/{i}".encode()).digest() for i in range(64))
    expires_at = None if ttl is None else time.time() + ttl
    return Envelope(headers, body[: (n * 37) % 2001], expires_at=expires_at)


def pg_rows(dsn: str, schema: str, table: str) -> list[tuple[Headers, bytes, Any]]:
    """(headers, body, expires) of every row, in seq order."""
    with psycopg.connect(dsn) as db:
        rows = db.execute(
            f'SELECT headers, body, expires FROM "{schema}"."{table}" ORDER BY seq'
        ).fetchall()
    return [(sql_headers.decode(h), bytes(b or b""), e) for h, b, e in rows]


def pg_raw_headers(dsn: str, schema: str, table: str) -> list[str]:
    with psycopg.connect(dsn) as db:
        rows = db.execute(f'SELECT headers FROM "{schema}"."{table}" ORDER BY seq').fetchall()
    return [str(h) for (h,) in rows]


def pg_poison_raw_headers(dsn: str, schema: str, table: str = "bridge.error") -> list[str]:
    """The original, unreadable Headers text of each poison copy in an error queue table."""
    return [json.loads(h)[RAW_HEADERS] for h in pg_raw_headers(dsn, schema, table)]


def pg_insert_raw(dsn: str, schema: str, table: str, headers: str, body: bytes = b"") -> None:
    with psycopg.connect(dsn) as db:
        db.execute(
            f'INSERT INTO "{schema}"."{table}" (id, headers, body) VALUES (%s, %s, %s)',
            (str(uuid.uuid4()), headers, body),
        )


def sqlite_rows(path: str, table: str) -> list[tuple[Headers, bytes, Any]]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        rows = db.execute(f'SELECT headers, body, expires FROM "{table}" ORDER BY seq').fetchall()
    return [(sql_headers.decode(h), bytes(b or b""), e) for h, b, e in rows]


def by_id(
    rows: Iterator[tuple[Headers, bytes, Any]] | list[tuple[Headers, bytes, Any]],
) -> dict[str, tuple[Headers, bytes]]:
    return {str(h.get("NServiceBus.MessageId")): (h, b) for h, b, _ in rows}


def translated(envelope: Envelope, reply_to: str) -> Headers:
    """The headers a route with address_map {REPLY_TO: reply_to} delivers."""
    headers = envelope.headers.copy()
    headers.set("NServiceBus.ReplyToAddress", reply_to)
    return headers
