"""`BridgeDelays`: where delays wait for destinations that cannot delay (Kafka).

The table is this project's own, on the SQL connection `delays: {connection}` names
(messaging-bridge.md §4), next to its queue tables; `bridge install` creates it. A row holds one
message: the destination (connection name, address, the route's record key setting), the
headers (a JSON array of [name, value] pairs, in order with duplicates and nulls, as a Kafka
record carries them; a JSON object, the SQL Headers column's form, is read too), the body and
when it is due, by the database clock (`Due`: UTC; SQLite: ISO 8601 text). `bridge.service.delaying`
stores rows and produces them when due: it takes a batch of due rows in a transaction (rows
other transactions hold are skipped, when taking and when reading the next due time alike:
several processes compete safely, and one waits while another sends; SQL Server: UPDLOCK,
READPAST in both), sends them, and
deletes them in that transaction only after the destination acknowledged them, so a crash
between the two sends them again (at least once, never lost). A row that can never be sent
(its destination refuses it for good, its connection is no longer in the config, its Headers
column cannot be read) goes to the error queue instead: its error-queue copy
(`bridge.nservicebus.deadletter.error_copy`, the reason in its headers, the destination as
`<connection>/<address>` in `NServiceBus.Bridge.Destination`) is inserted into the
queue table `error_queue` of the same connection (`delays: {error_queue}`, `bridge.error` by
default) and the row deleted, in one transaction of its own (`copy_to_error_queue`). The rows
sent are deleted first, in the take's transaction, with the refused rows put off by `PUT_OFF`
seconds (`settle`): a copy that cannot be written (the error queue's table is missing, or an
NGinn-layout error queue cannot hold the message, its id longer than NGinn's unique_id) never
undoes the deletes of the rows sent, which would send them again and again; the refused row
stays, due again `PUT_OFF` seconds later, when its copy is tried again.

Where a retry goes
    ServicePulse's retry sends a copy to its `NServiceBus.FailedQ` on the transport where it
    found the copy: this SQL connection. FailedQ is therefore a table of this connection, in
    its canonical form: the table a route (`retry_to`: the proxy of the registry's endpoint
    that the destination is, else a written route) reads and forwards to the destination, so
    a retry crosses to Kafka again (at once: a SQL source reads no delay request, and its due
    time has passed anyway); without
    one, a table named like the destination's topic, which does not exist unless someone
    makes it: the retry fails at ServiceControl ("table does not exist") until a table of that
    name and a route from it to the topic are added (then a retry crosses), or the message is
    sent again by hand (`bridge send`, the topic in `NServiceBus.Bridge.Destination`).

SQLite has no row locks: a transaction left open across the send would hold the file's write
lock, and every other writer of the file (routes, endpoints) would wait for the network. There
a take claims its rows instead, in a short write transaction of its own: their `Due` moves
`CLAIM_FOR` seconds on, so no other producer takes them meanwhile. The rows sent are deleted
afterwards in another short transaction; a failure gives the claims back (`Due` as it was);
a crash leaves them, and the rows are due again, and sent again, once the claim runs out.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from bridge.envelope import Envelope, Headers, PoisonMessage
from bridge.errors import HeadersFormatError
from bridge.nservicebus.deadletter import DEFAULT_ERROR_QUEUE, error_copy
from bridge.transports.sql import headers as headers_codec
from bridge.transports.sql.dialects.base import DbConnection, Dialect
from bridge.transports.sql.layouts.base import new_id

__all__ = [
    "CLAIM_FOR",
    "DESTINATION",
    "PUT_OFF",
    "TABLE",
    "DelayRow",
    "DelayTable",
    "read_headers",
    "write_headers",
]

TABLE = "BridgeDelays"
#: The header of an error copy naming the destination it never reached, `<connection>/<address>`.
DESTINATION = "NServiceBus.Bridge.Destination"
#: SQLite: seconds a taken row is claimed for its send, far beyond what a send takes (Kafka's
#: requests time out after `request_timeout_ms`, 40 s by default). A claim outlived (the
#: producer died mid-send) makes the row due again: at least once.
CLAIM_FOR = 300
#: Seconds a row that can never be sent waits, when its error copy could not be written
#: (module docstring); then it is taken as any due row: sent again (a refusal that has since
#: cleared lets it through, late) and, refused again, its copy tried again.
PUT_OFF = 300


@dataclass(frozen=True, slots=True)
class DelayRow:
    id: str
    connection: str
    address: str
    key: str | None
    envelope: Envelope
    #: SQLite: `Due` as it was before the take claimed the row (given back on a failure).
    due: str | None = None
    #: A row whose Headers column cannot be read: that column and why (the envelope then
    #: holds the body and no headers); it goes to the error queue (`settle`).
    unreadable: tuple[str, str] | None = None


class DelayTable:
    """The statements of `BridgeDelays` on one dialect, and its row mapping."""

    def __init__(
        self,
        dialect: Dialect,
        error_queue: str = DEFAULT_ERROR_QUEUE,
        retry_to: Mapping[tuple[str, str], str] | None = None,
    ) -> None:
        self.dialect = dialect
        #: The queue table, on the same connection, of the rows that can never be sent.
        self.error_queue = error_queue
        #: The table of this connection a route reads and forwards to a destination
        #: (connection, address): an error copy's FailedQ (module docstring).
        self.retry_to = dict(retry_to or {})
        d, p = dialect, dialect.placeholder
        t = d.table(TABLE)
        tp = d.param_safe(t)
        columns = "Id, Connection, Address, RecordKey, Headers, Body, Due"
        taken = "Id, Connection, Address, RecordKey, Headers, Body"
        if d.kind == "sqlserver":
            literal = t.replace("'", "''")
            self.create: tuple[str, ...] = (
                f"IF OBJECT_ID(N'{literal}', N'U') IS NULL\n"
                f"CREATE TABLE {t} (\n  Id uniqueidentifier NOT NULL PRIMARY KEY,\n"
                "  Connection nvarchar(200) NOT NULL,\n  Address nvarchar(400) NOT NULL,\n"
                "  RecordKey nvarchar(400) NULL,\n  Headers nvarchar(max) NOT NULL,\n"
                "  Body varbinary(max),\n  Due datetime NOT NULL,\n  INDEX Index_Due (Due)\n)",
            )
            self.store = (
                f"INSERT INTO {t} ({columns}) VALUES (?, ?, ?, ?, ?, ?, "
                "DATEADD(ms, ? % 1000, DATEADD(s, CAST(? / 1000 AS int), GETUTCDATE())))"
            )
            self._take = (
                f"SELECT TOP(?) {taken} FROM {t} WITH (UPDLOCK, READPAST, ROWLOCK)\n"
                "WHERE Due <= GETUTCDATE(){skip} ORDER BY Due"
            )
            # UPDLOCK as `take` has it: READPAST alone skips only rows under exclusive locks,
            # and would read the rows another producer's take holds (update locks).
            self.next_due = (
                "SELECT TOP 1 (CAST(Due AS float) - CAST(GETUTCDATE() AS float)) * 86400 "
                f"FROM {t} WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY Due"
            )
            self._next_due = self.next_due.replace(" ORDER BY", " WHERE 1 = 1{skip} ORDER BY")
            self.waiting = (
                "SELECT count(*), (CAST(min(Due) AS float) - CAST(GETUTCDATE() AS float)) * 86400 "
                f"FROM {t} WHERE Connection = ? AND Address = ?"
            )
            self.put_off = f"UPDATE {t} SET Due = DATEADD(s, ?, GETUTCDATE()) WHERE Id = ?"
        elif d.kind == "postgresql":
            self.create = (
                f"CREATE TABLE IF NOT EXISTS {t} (\n  Id uuid NOT NULL PRIMARY KEY,\n"
                "  Connection text NOT NULL,\n  Address text NOT NULL,\n  RecordKey text NULL,\n"
                "  Headers text NOT NULL,\n  Body bytea,\n  Due timestamptz NOT NULL\n)",
                f"CREATE INDEX IF NOT EXISTS {d.quote(TABLE + '_Due')} ON {t} (Due)",
            )
            self.store = (
                f"INSERT INTO {tp} ({columns}) VALUES "
                f"({p}, {p}, {p}, {p}, {p}, {p}, now() + {p} * INTERVAL '1 millisecond')"
            )
            self._take = (
                f"SELECT {taken} FROM {tp} WHERE Due <= now(){{skip}} ORDER BY Due "
                f"LIMIT {p} FOR UPDATE SKIP LOCKED"
            )
            # Rows another producer holds are skipped here as `take` skips them: were they
            # read, a held due row would make the producer look again at once, in a loop.
            self.next_due = (
                f"SELECT EXTRACT(EPOCH FROM Due - now()) FROM {t} ORDER BY Due LIMIT 1 "
                "FOR KEY SHARE SKIP LOCKED"
            )
            self._next_due = (
                f"SELECT EXTRACT(EPOCH FROM Due - now()) FROM {tp} WHERE TRUE{{skip}} "
                "ORDER BY Due LIMIT 1 FOR KEY SHARE SKIP LOCKED"
            )
            self.waiting = (
                f"SELECT count(*), EXTRACT(EPOCH FROM min(Due) - now()) FROM {tp} "
                f"WHERE Connection = {p} AND Address = {p}"
            )
            self.put_off = f"UPDATE {tp} SET Due = now() + {p} * INTERVAL '1 second' WHERE Id = {p}"
        else:
            self.create = (
                f"CREATE TABLE IF NOT EXISTS {t} (\n  Id TEXT NOT NULL PRIMARY KEY,\n"
                "  Connection TEXT NOT NULL,\n  Address TEXT NOT NULL,\n  RecordKey TEXT NULL,\n"
                "  Headers TEXT NOT NULL,\n  Body BLOB,\n  Due TEXT NOT NULL\n)",
                f"CREATE INDEX IF NOT EXISTS {d.quote(TABLE + '_Due')} ON {t} (Due)",
            )
            self.store = (
                f"INSERT INTO {t} ({columns}) VALUES (?, ?, ?, ?, ?, ?, "
                "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', (? / 1000.0) || ' seconds'))"
            )
            self._take = f"SELECT {taken}, Due FROM {t} WHERE Due <= ?{{skip}} ORDER BY Due LIMIT ?"
            self.claim = f"UPDATE {t} SET Due = ? WHERE Id = ?"
            self.next_due = (
                f"SELECT (julianday(Due) - julianday('now')) * 86400.0 FROM {t} "
                "ORDER BY Due LIMIT 1"
            )
            self._next_due = self.next_due.replace(" ORDER BY", " WHERE 1 = 1{skip} ORDER BY")
            self.waiting = (
                f"SELECT count(*), (julianday(min(Due)) - julianday('now')) * 86400.0 FROM {t} "
                "WHERE Connection = ? AND Address = ?"
            )
            self.put_off = (
                f"UPDATE {t} SET Due = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ? || ' seconds') "
                "WHERE Id = ?"
            )
        self.delete = f"DELETE FROM {tp} WHERE Id = {p}"
        self._skip = f" AND NOT (Connection = {p} AND Address = {p})"
        self.take = self.take_statement(0)

    def store_params(
        self, envelope: Envelope, due_ms: int, connection: str, address: str, key: str | None
    ) -> Sequence[Any]:
        """HeadersFormatError where the row cannot hold the headers."""
        headers = write_headers(envelope.headers)
        row = (new_id(), connection, address, key, headers, bytes(envelope.body))
        return (*row, due_ms, due_ms) if self.dialect.kind == "sqlserver" else (*row, due_ms)

    def take_statement(self, skipped: int) -> str:
        """`take`, leaving out the rows of `skipped` destinations (connection, address)."""
        return self._take.replace("{skip}", self._skip * skipped)

    def take_due(
        self, batch: int, db: DbConnection, skip: Sequence[tuple[str, str]] = ()
    ) -> list[DelayRow]:
        """Of up to `batch` due rows, in due order, those for the first one's destination,
        leaving out those of the destinations in `skip` (connection, address: backing off):
        locked in a transaction left open (rolled back when none); SQLite: claimed in a
        transaction committed (module docstring), opened only after a read found a row due."""
        cursor = db.cursor()
        sqlite = self.dialect.kind == "sqlite"
        take = self.take_statement(len(skip))
        skipped = [value for pair in skip for value in pair]
        if sqlite:
            now = _sqlite_time(datetime.now(UTC))
            # A read first: an idle table takes no write lock on the file (as the movers look).
            cursor.execute(take, (now, *skipped, 1))
            if not cursor.fetchall():
                db.rollback()
                return []
            self.dialect.begin(db)
            cursor.execute(take, (now, *skipped, batch))
        elif self.dialect.kind == "sqlserver":
            self.dialect.begin(db)
            cursor.execute(take, (batch, *skipped))
        else:
            self.dialect.begin(db)
            cursor.execute(take, (*skipped, batch))
        rows = [_row(row, sqlite) for row in cursor.fetchall()]
        if rows:
            to = (rows[0].connection, rows[0].address, rows[0].key)
            rows = [row for row in rows if (row.connection, row.address, row.key) == to]
        if not rows:
            db.rollback()
        elif sqlite:
            until = _sqlite_time(datetime.now(UTC) + timedelta(seconds=CLAIM_FOR))
            cursor.executemany(self.claim, [(until, row.id) for row in rows])
            db.commit()
        return rows

    def give_back(self, rows: Sequence[DelayRow], db: DbConnection) -> None:
        """After a failure: the rows `take_due` took are due as they were (rolled back;
        SQLite: their claims undone)."""
        if self.dialect.kind != "sqlite":
            db.rollback()
            return
        db.rollback()
        self.dialect.begin(db)
        db.cursor().executemany(self.claim, [(row.due, row.id) for row in rows])
        db.commit()

    def waiting_for(
        self, connection: str, address: str, db: DbConnection
    ) -> tuple[int, float | None]:
        """How many rows wait for `connection`/`address`, and seconds until the first is due."""
        cursor = db.cursor()
        try:
            cursor.execute(self.waiting, (connection, address))
            row = cursor.fetchone()
        finally:
            db.rollback()
        count = int(row[0]) if row is not None else 0
        due = None if not count or row is None or row[1] is None else max(0.0, float(row[1]))
        return count, due

    def settle(
        self, sent: Sequence[str], failed: Sequence[tuple[DelayRow, str]], db: DbConnection
    ) -> None:
        """In the transaction `take_due` left open (SQLite: a new one): delete the rows sent,
        put the failed ones (refused for good, or unreadable) off by `PUT_OFF` seconds, and
        commit. Their error copies are written afterwards, each on its own
        (`copy_to_error_queue`): one that cannot be written never undoes these deletes."""
        if self.dialect.kind == "sqlite":
            self.dialect.begin(db)
        cursor = db.cursor()
        if failed:
            cursor.executemany(self.put_off, [(PUT_OFF, row.id) for row, _ in failed])
        if sent:
            cursor.executemany(self.delete, [(i,) for i in sent])
        db.commit()

    def copy_to_error_queue(self, row: DelayRow, reason: str, db: DbConnection) -> None:
        """Insert the error copy of `row` (`_error_copy`) into `error_queue` and delete the
        row, in one transaction; a failure (the table missing, a copy the error queue's layout
        cannot hold: HeadersFormatError) leaves the row as `settle` put it off."""
        d = self.dialect
        failed_q = d.canonical_address(
            self.retry_to.get((row.connection, row.address), row.address)
        )
        copy = d.send_params(
            d.layout.outgoing(
                _error_copy(row, reason, failed_q), time.time(), address=self.error_queue
            )
        )
        if d.kind == "sqlite":
            d.begin(db)
        cursor = db.cursor()
        cursor.execute(d.send_statement(db, self.error_queue), copy)
        cursor.execute(self.delete, (row.id,))
        db.commit()

    def seconds_to_next_due(
        self, db: DbConnection, skip: Sequence[tuple[str, str]] = ()
    ) -> float | None:
        """Seconds until the first row is due (negative: overdue), leaving out the rows of
        the destinations in `skip` (as `take_due`); None when there is none."""
        cursor = db.cursor()
        try:
            if skip:
                statement = self._next_due.replace("{skip}", self._skip * len(skip))
                cursor.execute(statement, [value for pair in skip for value in pair])
            else:
                cursor.execute(self.next_due)
            row = cursor.fetchone()
        finally:
            db.rollback()
        return None if row is None or row[0] is None else float(row[0])


def _row(row: Sequence[Any], sqlite: bool) -> DelayRow:
    text, body = _text(row[4]), _bytes(row[5])
    try:
        envelope, unreadable = Envelope(read_headers(text), body), None
    except HeadersFormatError as exc:
        envelope, unreadable = Envelope(Headers(), body), (text, str(exc))
    return DelayRow(
        id=str(row[0]),
        connection=str(row[1]),
        address=str(row[2]),
        key=row[3],
        envelope=envelope,
        due=str(row[6]) if sqlite else None,
        unreadable=unreadable,
    )


def _error_copy(row: DelayRow, reason: str, failed_q: str) -> Envelope:
    """The error-queue copy of a row that can never be sent: `NServiceBus.FailedQ` is
    `failed_q` (where a retry goes, module docstring), its destination is in
    `NServiceBus.Bridge.Destination`, and the reason names it."""
    why = (
        f"the delayed message ({TABLE} row {row.id}) to {row.connection}/{row.address} can "
        f"never be sent: {reason}"
    )
    original: Envelope | PoisonMessage = row.envelope
    if row.unreadable is not None:
        original = PoisonMessage(
            raw_headers=row.unreadable[0],
            body=bytes(row.envelope.body),
            reason=why,
            exception_type=HeadersFormatError.__name__,
            native_id=row.id,
        )
    copy = error_copy(original, why, failed_q)
    copy.headers.set(DESTINATION, f"{row.connection}/{row.address}")
    return copy


def write_headers(headers: Headers) -> str:
    """The Headers column: a JSON array of [name, value] pairs in order, duplicates and nulls
    kept (a Kafka record's headers are a multimap); HeadersFormatError for a name or value
    UTF-8 cannot carry (a lone surrogate)."""
    pairs = list(headers)
    try:
        text = json.dumps(pairs, ensure_ascii=False, separators=(",", ":"))
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise HeadersFormatError(f"a header is not encodable as UTF-8: {exc}") from exc
    return text


def read_headers(text: str) -> Headers:
    """`write_headers`' inverse; a JSON object (the SQL Headers column's form, which rows
    stored before the array form hold) is read as that column; HeadersFormatError for
    anything else."""
    if not text.lstrip().startswith("["):
        return headers_codec.decode(text)
    try:
        pairs = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise HeadersFormatError(f"headers are not valid JSON: {exc}") from exc
    items: list[tuple[str, str | None]] = []
    for pair in pairs:
        if not (
            isinstance(pair, list)
            and len(pair) == 2
            and isinstance(pair[0], str)
            and (pair[1] is None or isinstance(pair[1], str))
        ):
            raise HeadersFormatError(f"headers must be [name, value] pairs of text, got {pair!r}")
        items.append((pair[0], pair[1]))
    if "\\u" in text:  # an escape may stand for a lone surrogate, which UTF-8 cannot carry
        try:
            json.dumps(items, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise HeadersFormatError(f"a header is not encodable as UTF-8: {exc}") from exc
    return Headers(items)


def _sqlite_time(moment: datetime) -> str:
    """`Due`'s text on SQLite: ISO 8601 UTC to the millisecond, as `strftime('%Y-%m-%dT%H:%M:%fZ')`
    writes it."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _text(value: object) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _bytes(value: object) -> bytes:
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode("utf-8")
    assert isinstance(value, bytes | bytearray | memoryview)
    return bytes(value)
