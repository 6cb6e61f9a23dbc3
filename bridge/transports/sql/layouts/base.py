"""Queue-table layouts: what a queue table holds, its statements, and rows <-> envelopes.

A `Layout` is chosen by a SQL connection's `layout` key and built on that connection's
`Dialect`: it writes every statement of `QueueStatements` from the dialect's primitives
(quoting, placeholder, UTC clock, expiry, batch limit) and maps rows to envelopes and back. The
dialect keeps the driver, names and errors; neither knows the transport. `LAYOUTS` names the
module of each (layout, database) pair, so adding a layout is adding one module in this folder
and its lines there:

    nservicebus on sqlserver     `nservicebus_sqlserver`: the NServiceBus SQL Server
                                 transport's table (§1), verbatim
    nservicebus on postgresql    `nservicebus_postgresql`: the NServiceBus PostgreSQL
                                 transport's table (§2)
    nservicebus on sqlite        `nservicebus_postgresql` too: SQLite has no NServiceBus
                                 transport of its own, so its queue files hold the PostgreSQL
                                 transport's columns in SQLite's types (§3)
    nginn on each of the three   `nginn`: NGinn.MessageBus's table (its subqueues, `k=v|k=v`
                                 headers, local times), read and written as NGinn does; its
                                 rows are its own (`nginn_rows`), not the ones below

The NServiceBus row mapping below is the base class's; both NServiceBus layouts use it.

A layout may also add parameters in front of its receive's (`receive_params`: NGinn's table
is shared by endpoints), keep what a source cannot forward in its own table (`keeps_failed`),
run housekeeping between a source's batches, and set up each connection (`on_connect`).

Row written by a send (`OutgoingRow`, the parameters of `QueueStatements.send` in this order):
    id       fresh uuid4 as text: the native id, never the logical message id
    ttl_ms   remaining lifetime in whole milliseconds (a message the bridge originates: the
             time to live it was given), or None for "never expires";
             the database turns it into `Expires` with its own clock
    headers  the Headers column text (`bridge.transports.sql.headers.write`: the text the row
             was read from when its headers are unchanged, else `encode`)
    body     raw bytes, never None (an empty body is b"")

Row returned by a receive (`QueueRow`, the result columns of `QueueStatements.receive`):
    id, expired flag (0/1, by the database clock), headers, body, remaining ms (database clock,
    None when the row never expires) and, where the database returns rows in no defined order,
    a sixth column holding the FIFO sequence number to sort by.

Row read by a scan (`ScannedRow`, the result columns of `QueueStatements.scan_range`), which
reads without taking anything: id, expired flag, headers, body size in bytes, sequence number.
"""

from __future__ import annotations

import importlib
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, cast

from bridge.envelope import MESSAGE_ID, TIME_SENT, Envelope, Headers, PoisonMessage
from bridge.errors import ConfigError, HeadersFormatError
from bridge.nservicebus.lifetime import never_expires, time_to_live_ms
from bridge.nservicebus.wireformat import timestamp_seconds
from bridge.transports.sql import headers as headers_codec

if TYPE_CHECKING:
    from bridge.transports.sql.dialects.base import DbConnection, Dialect

__all__ = [
    "LAYOUTS",
    "CheckpointStatements",
    "Layout",
    "OutgoingRow",
    "QueueRow",
    "QueueStatements",
    "ScannedRow",
    "TakenRow",
    "incoming",
    "load_layout",
    "new_id",
    "new_ids",
    "outgoing",
    "received_rows",
    "scanned_rows",
]


@dataclass(frozen=True, slots=True)
class QueueStatements:
    """Every statement run against one queue table, already holding its quoted name.

    create         DDL, idempotent, run in order by `install`
    send           params (id, ttl_ms, headers, body); also moves poison rows to an error queue
    receive        params (max_rows,); deletes up to max_rows oldest rows, returns `QueueRow`s
    depth          -> one row, one int: messages waiting (an estimate where the layout says so)
    oldest         -> at most one row: the Headers column of the oldest row
    expired        -> one row, one int: rows whose Expires is past
    purge_expired  params (batch_size,): delete up to batch_size expired rows

    The sequence-range statements serve bulk jobs (`bridge.migrate`), which split a table by its
    FIFO sequence (`seq`, SQL Server's `RowVersion`) into ranges worked on in parallel:

    bounds         -> one row: (lowest seq, highest seq), both NULL when the table is empty
    receive_range  params (lo, hi, max_rows): `receive` of the rows with lo <= seq <= hi only
    count_range    params (lo, hi) -> one row, one int: rows with lo <= seq <= hi
    scan_range     params (after, hi, max_rows): reads (never locks or deletes) up to max_rows
                   `ScannedRow`s with after < seq <= hi, in seq order

    send_staged    no params; `send` of every row in the session's send stage, in its order
                   (`Dialect.stage_rows`); empty where the dialect has no stage
    """

    create: tuple[str, ...]
    send: str
    receive: str
    depth: str
    oldest: str
    expired: str
    purge_expired: str
    bounds: str
    receive_range: str
    count_range: str
    scan_range: str
    send_staged: str = ""


@dataclass(frozen=True, slots=True)
class CheckpointStatements:
    """The `BridgeCheckpoints (name, position)` table: source positions stored with rows.

    create      DDL, idempotent;  upsert  params (name, position);  load  -> rows (name, position)
    insert_new  params (name, position): insert; affects no row when `name` is stored already
    advance     params (position, name, expected): update; affects no row unless the stored
                position is `expected` (with `insert_new`, a fence between two writers)
    """

    table: str
    create: tuple[str, ...]
    upsert: str
    load: str
    insert_new: str
    advance: str


class OutgoingRow(NamedTuple):  # a tuple: one is made per message sent
    id: str
    ttl_ms: int | None
    headers: str | bytes
    body: bytes


class QueueRow(NamedTuple):  # a tuple: one is made per message received
    native_id: str
    expired: bool
    headers: str | bytes | None
    body: bytes
    remaining_ms: int | None


@dataclass(frozen=True, slots=True)
class ScannedRow:
    native_id: str
    expired: bool
    headers: str | bytes | None
    body_size: int
    seq: int

    def decoded_headers(self) -> Headers:
        """The Headers column read with the layout's codec; HeadersFormatError when it cannot
        be read (the row would be a poison message)."""
        return headers_codec.decode(self.headers)


def outgoing(envelope: Envelope, now: float, native_id: str | None = None) -> OutgoingRow:
    """The row an NServiceBus endpoint would write for `envelope` at wall-clock time `now`
    (`native_id` from `new_ids` when many rows are made at once).

    A lifetime already spent is written as 0 ms: the row expires at once and the receiver drops
    it, as it would have dropped the message itself. An error-queue or audit copy is written
    without one, a message the bridge originates with the time to live it was given
    (`bridge.nservicebus.lifetime`).
    """
    lifetime = time_to_live_ms(envelope, now)
    ttl_ms = None if lifetime is None else max(0, round(lifetime))
    return OutgoingRow(
        native_id or new_id(), ttl_ms, headers_codec.write(envelope.headers), bytes(envelope.body)
    )


def new_ids(count: int) -> list[str]:
    """`count` random (version 4) UUIDs as text, as `str(uuid.uuid4())` makes them, from one
    `os.urandom` call: a call per id was a syscall (and a GIL hand-off) per message sent."""
    pool = os.urandom(16 * count).hex()
    return [
        f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"
        for h in (pool[i : i + 32] for i in range(0, 32 * count, 32))
    ]


def new_id() -> str:
    return new_ids(1)[0]


#: The RFC 4122 variant bits (10xx) over the random first nibble of the fourth group.
_VARIANT = {f"{n:x}": f"{8 | (n & 3):x}" for n in range(16)}


def received_rows(rows: Sequence[Sequence[Any]]) -> list[QueueRow]:
    """Result rows of `receive` in FIFO order (by the sixth column where there is one)."""
    if rows and len(rows[0]) > 5:
        rows = sorted(rows, key=lambda row: int(row[5]))
    return [
        QueueRow(
            native_id=str(row[0]),
            expired=bool(row[1]),
            headers=row[2],
            body=_as_bytes(row[3]),
            remaining_ms=None if row[4] is None else int(row[4]),
        )
        for row in rows
    ]


def scanned_rows(rows: Sequence[Sequence[Any]]) -> list[ScannedRow]:
    """Result rows of `scan_range`."""
    return [
        ScannedRow(
            native_id=str(row[0]),
            expired=bool(row[1]),
            headers=_as_text_if_utf8(row[2]),
            body_size=int(row[3] or 0),
            seq=int(row[4]),
        )
        for row in rows
    ]


def incoming(row: QueueRow, now: float) -> Envelope | PoisonMessage:
    """The envelope of a live row, or a poison message when its headers cannot be read.

    A row without `NServiceBus.MessageId`, or with an empty one (a native-integration insert),
    gets its row Id as message id, as an NServiceBus endpoint reading it does. The headers keep
    the column text until they change (`headers.read`), so a row forwarded to another queue
    table unchanged keeps its Headers text byte for byte. Its lifetime is what `Expires` leaves
    of it, none for an error-queue or audit copy.
    """
    try:
        headers = headers_codec.read(row.headers)
    except HeadersFormatError as exc:
        return PoisonMessage(
            raw_headers=_as_text_if_utf8(row.headers),
            body=row.body,
            reason=str(exc),
            exception_type=type(exc).__name__,
            native_id=row.native_id,
        )
    if not headers.get(MESSAGE_ID):  # a native insert without one: its row Id, as endpoints do
        headers.set(MESSAGE_ID, row.native_id)
    deadline = None
    if row.remaining_ms is not None and not never_expires(headers):
        deadline = now + row.remaining_ms / 1000
    return Envelope(headers, row.body, expires_at=deadline, native_id=row.native_id)


def _as_text_if_utf8(raw: str | bytes | None) -> str | bytes | None:
    """A Headers column read as bytes (SQLite) as the text it held, unless that is not UTF-8."""
    if isinstance(raw, bytes):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw
    return raw


def _as_bytes(value: object) -> bytes:
    if value is None:
        return b""
    if isinstance(value, str):  # SQLite keeps whatever type a foreign writer stored
        return value.encode("utf-8")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"unexpected Body column value of type {type(value).__name__}")


class TakenRow(Protocol):
    """What the source reads of every row a layout's receive returns (`QueueRow`'s fields)."""

    @property
    def native_id(self) -> str: ...

    @property
    def expired(self) -> bool: ...


class Layout(ABC):
    """One queue-table layout on one connection's dialect; the NServiceBus row mapping.

    A subclass writes `queue_statements` from `self.dialect`'s primitives and, where its table
    differs, overrides the mapping and the send hooks. A layout whose rows are not
    `QueueRow`s and `OutgoingRow`s overrides the four mapping methods together: the source
    and the sink only hand the rows of one to the other.
    """

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect

    @abstractmethod
    def queue_statements(self, name: str) -> QueueStatements:
        """Every statement the transport runs against queue table `name`."""

    def receive_params(self, name: str) -> tuple[Any, ...]:
        """Parameters in front of those `QueueStatements` names for its receive, range and
        peek statements of table `name` (none: the table is the whole queue)."""
        return ()

    def send_statement(self, db: DbConnection, name: str) -> str:
        """The insert for table `name`; a layout may look at the table first (and cache)."""
        return self.queue_statements(name).send

    def send_params(self, row: Any) -> Sequence[Any]:
        """Parameters of `send` for a row `outgoing` made: (id, ttl_ms, headers, body) here."""
        return cast(OutgoingRow, row)

    def warnings(self, db: DbConnection, name: str) -> list[str]:
        """Human-readable problems of an existing table that still works."""
        return []

    def elsewhere(self, db: DbConnection, name: str) -> int:
        """Messages in the table for another endpoint, which no source here takes (NGinn's
        store-and-forward rows); 0 where a table holds only its own."""
        return 0

    #: Whether a source keeps what it cannot forward in its own table (`keep_failed`) when its
    #: route names no error queue; else it needs one.
    keeps_failed = False

    def keep_failed(self, db: DbConnection, name: str, failed: Sequence[tuple[str, str]]) -> None:
        """Mark rows (native id, why) of table `name` taken in the open transaction as failed,
        in that transaction (only where `keeps_failed`)."""
        raise NotImplementedError(f"the {type(self).__name__} layout keeps no failed rows")

    def on_connect(self, db: DbConnection) -> None:  # noqa: B027 - most layouts need nothing
        """Set up a connection right after it opened (nothing here)."""

    def housekeeping(self, name: str) -> tuple[str, ...]:
        """Statements a source of table `name` runs now and then, each in a transaction of its
        own, without parameters (none here)."""
        return ()

    def oldest_age(self, value: Any, now: float) -> float | None:
        """Seconds since the oldest row was sent, from what `oldest` returned (None: no row)."""
        return _age_seconds(value, now)

    # The NServiceBus mapping (the functions above); a layout whose rows differ overrides it.
    def outgoing(
        self, envelope: Envelope, now: float, native_id: str | None = None, *, address: str = ""
    ) -> Any:
        """The row written for `envelope` into table `address` (`send_params` makes the
        statement's parameters of it)."""
        return outgoing(envelope, now, native_id)

    def received_rows(self, rows: Sequence[Sequence[Any]]) -> Sequence[TakenRow]:
        return received_rows(rows)

    def incoming(self, row: Any, now: float) -> Envelope | PoisonMessage:
        """The envelope of a live row `received_rows` made, or a poison message."""
        return incoming(cast(QueueRow, row), now)

    scanned_rows = staticmethod(scanned_rows)


def _age_seconds(raw_headers: str | bytes | None, now: float) -> float | None:
    """Seconds since the row's `NServiceBus.TimeSent`; None when it has no readable one."""
    try:
        sent = headers_codec.decode(raw_headers).get(TIME_SENT)
        if sent is None:
            return None
        return max(0.0, now - timestamp_seconds(sent))
    except (HeadersFormatError, ValueError):
        return None


_HERE = "bridge.transports.sql.layouts"

#: (layout, dialect kind) -> "module:class"; imported on first use.
LAYOUTS = {
    ("nservicebus", "sqlserver"): f"{_HERE}.nservicebus_sqlserver:SqlServerLayout",
    ("nservicebus", "postgresql"): f"{_HERE}.nservicebus_postgresql:PostgresLayout",
    ("nservicebus", "sqlite"): f"{_HERE}.nservicebus_postgresql:PostgresLayout",  # §3
    ("nginn", "sqlserver"): f"{_HERE}.nginn:NGinnLayout",
    ("nginn", "postgresql"): f"{_HERE}.nginn:NGinnLayout",
    ("nginn", "sqlite"): f"{_HERE}.nginn:NGinnLayout",
}


def load_layout(name: str, dialect: Dialect) -> Layout:
    """The layout `name` on `dialect`; ConfigError when that database has no such layout."""
    target = LAYOUTS.get((name, dialect.kind))
    if target is None:
        known = sorted(layout for layout, kind in LAYOUTS if kind == dialect.kind)
        raise ConfigError(
            f"{dialect.describe()}: no queue-table layout {name!r} on {dialect.kind} "
            f"(known: {', '.join(known)})"
        )
    module, _, cls = target.partition(":")
    layout: type[Layout] = getattr(importlib.import_module(module), cls)
    return layout(dialect)
