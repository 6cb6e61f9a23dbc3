"""A queue table in PostgreSQL or SQLite, written and read with psycopg or sqlite3.

The legs run the bridge's own statements (its layout's `DELETE ... RETURNING` receive, its
insert, on PostgreSQL its staged insert), so that a route and its raw legs do the same database
work; what they leave out is everything else the bridge does.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from bench.legs.place import PACE_WAIT, POLL, Place, chunks, pacing
from bench.messages import NUMBER, WRITTEN_AT, Message, body_of, headers_json, headers_of
from bridge.config.models import PostgresConnection, SqliteConnection
from bridge.transports import load

__all__ = ["SqlPlace"]

#: Batches a SQLite source takes in one transaction; mirrors the bridge's default (the source
#: receives the next batch in the transaction holding the last, see "Chained batches" in its
#: SQL transport).
CHAIN = 16
#: Rows from which the bridge's PostgreSQL sink stages a send (COPY, then INSERT ... SELECT);
#: mirrors the bridge's default.
STAGE_FROM = 64


def set_up_sqlite(db: sqlite3.Connection) -> None:
    """What every connection the bridge's SQLite transport opens sets, so that a raw
    connection measures what the bridge runs on: WAL, and `secure_delete=FAST` (some builds
    turn `secure_delete` on, which rewrites every page a delete frees with zeros)."""
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA secure_delete=FAST")


class SqlPlace(Place):
    """A queue table in PostgreSQL (a schema of its own) or SQLite (a file of its own)."""

    def __init__(self, kind: str, address: str, *, dsn: str = "", schema: str = "", path: str = ""):
        super().__init__(address)
        self.kind = kind
        self.connection = kind
        self.dsn, self.schema, self.path = dsn, schema, path
        config: PostgresConnection | SqliteConnection
        if kind == "postgresql":
            config = PostgresConnection(type="postgresql", dsn=dsn, schema=schema)
            self.param = "%s"
        else:
            config = SqliteConnection(type="sqlite", path=path)
            self.param = "?"
        transport: Any = load("bench", config)
        self.transport = transport
        self.statements = transport.dialect.queue_statements(address)
        self.table = transport.dialect.table(address)

    def connection_yaml(self) -> str:
        if self.kind == "postgresql":
            return f"{{type: postgresql, dsn: {json.dumps(self.dsn)}, schema: {self.schema}}}"
        return f"{{type: sqlite, path: {json.dumps(self.path)}}}"

    def connect(self, *, receiving: bool = False) -> Any:
        """A raw connection with the session settings the bridge's own would have (a source's
        when `receiving`), so that a raw leg and a route run on the same database settings."""
        if self.kind == "postgresql":
            db = psycopg.connect(self.dsn)
        else:
            db = sqlite3.connect(
                self.path, timeout=30, isolation_level=None, check_same_thread=False
            )
            set_up_sqlite(db)
        if receiving:
            self.transport.dialect.receiving_session(db)
        return db

    def _begin(self, db: Any) -> None:
        if self.kind == "sqlite":
            db.execute("BEGIN IMMEDIATE")

    async def create(self) -> None:
        await self.transport.install([self.address])
        await self.transport.close()

    async def drop(self) -> None:
        def run() -> None:
            db = self.connect()
            try:
                db.execute(f"DROP TABLE IF EXISTS {self.table}")
                db.commit()
            finally:
                db.close()

        await asyncio.to_thread(run)

    @staticmethod
    def rows(messages: Sequence[Message]) -> list[tuple[str, None, str, bytes]]:
        return [(str(uuid.uuid4()), None, headers_json(h), body) for h, body in messages]

    # raw legs ----------------------------------------------------------------------------------

    async def write(self, messages: Sequence[Message], batch: int, staged: bool = True) -> float:
        """Batched insert, a commit per batch. On PostgreSQL the way the bridge's sink inserts
        a batch of `STAGE_FROM` rows or more, unless not `staged`: a binary COPY into the
        session's temporary table, then the layout's INSERT ... SELECT (measured faster than
        psycopg's pipelined `executemany`, which `staged=False` runs instead)."""
        rows = self.rows(messages)
        dialect = self.transport.dialect
        staged = staged and bool(dialect.send_stage) and batch >= STAGE_FROM

        def run() -> float:
            db = self.connect()
            try:
                started = time.perf_counter()
                for chunk in chunks(rows, batch):
                    self._begin(db)
                    if staged:
                        dialect.stage_rows(db, chunk)
                        db.cursor().execute(self.statements.send_staged)
                    else:
                        db.cursor().executemany(self.statements.send, chunk)
                    db.commit()
                return time.perf_counter() - started
            finally:
                db.close()

        return await asyncio.to_thread(run)

    async def read(self, count: int, batch: int) -> float:
        """Batched receive with the bridge's transaction shape: on PostgreSQL a commit per
        batch, on SQLite up to `CHAIN` batches per transaction (the bridge's SQLite source
        receives the next batch in the transaction holding the last)."""
        per_transaction = 1 if self.kind == "postgresql" else CHAIN

        def run() -> float:
            db = self.connect(receiving=True)
            try:
                got, started = 0, time.perf_counter()
                while got < count:
                    self._begin(db)
                    cursor = db.cursor()
                    for _ in range(per_transaction):
                        cursor.execute(self.statements.receive, (batch,))
                        got += len(cursor.fetchall())
                        if got >= count:
                            break
                    db.commit()
                return time.perf_counter() - started
            finally:
                db.close()

        return await asyncio.to_thread(run)

    # watching ----------------------------------------------------------------------------------

    def scalar(self, statement: str) -> Any:
        db = self.connect()
        try:
            row = db.execute(statement).fetchone()
            db.rollback()
            return None if row is None else row[0]
        finally:
            db.close()

    def watcher(self) -> Callable[[], int]:
        """Rows inserted so far into a fresh table (its highest seq: an index lookup)."""
        db = self.connect()
        if self.kind == "postgresql":
            db.autocommit = True
        statement = f"SELECT max(seq) FROM {self.table}"

        def inserted() -> int:
            row = db.execute(statement).fetchone()
            return int(row[0] or 0) if row else 0

        return inserted

    def emptiness(self) -> Callable[[], int | None]:
        """The lowest seq left (None: empty), one index lookup per call."""
        db = self.connect()
        if self.kind == "postgresql":
            db.autocommit = True
        statement = f"SELECT min(seq) FROM {self.table}"

        def lowest() -> int | None:
            row = db.execute(statement).fetchone()
            return None if row is None or row[0] is None else int(row[0])

        return lowest

    async def count(self) -> int:
        return int(await asyncio.to_thread(self.scalar, f"SELECT count(*) FROM {self.table}"))

    async def clear(self) -> None:
        """Empty the table and vacuum it, so that what is measured next meets a table like a
        fresh one, not 100,000 dead rows (and an autovacuum of them) left by this cleanup."""

        def run() -> None:
            db = self.connect()
            try:
                db.execute(f"DELETE FROM {self.table}")
                db.commit()
                if self.kind == "postgresql":
                    db.autocommit = True
                    db.execute(f"VACUUM {self.table}")
                else:
                    db.execute("VACUUM")
                    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                db.close()

        await asyncio.to_thread(run)

    # latency -----------------------------------------------------------------------------------

    async def paced(self, rate: float, seconds: float, size: int) -> int:
        body = body_of(size)

        def run() -> int:
            db = self.connect()
            try:
                sent = 0
                for before, due in pacing(rate, seconds):
                    if not due:
                        time.sleep(PACE_WAIT)
                        continue
                    now = time.time()
                    rows = [
                        (str(uuid.uuid4()), None, headers_json(headers_of(before + i, now)), body)
                        for i in range(due)
                    ]
                    self._begin(db)
                    db.cursor().executemany(self.statements.send, rows)
                    db.commit()
                    sent = before + due
                return sent
            finally:
                db.close()

        return await asyncio.to_thread(run)

    async def timed(self, expected: int, since: float, first: int, timeout: float) -> list[float]:
        take = (
            f"DELETE FROM {self.table} WHERE seq IN "
            f"(SELECT seq FROM {self.table} ORDER BY seq LIMIT 1000"
            + (" FOR UPDATE SKIP LOCKED)" if self.kind == "postgresql" else ")")
            + " RETURNING headers"
        )

        def run() -> list[float]:
            db = self.connect()
            latencies: list[float] = []
            deadline = time.monotonic() + timeout
            try:
                while len(latencies) < expected and time.monotonic() < deadline:
                    self._begin(db)
                    rows = db.execute(take).fetchall()
                    db.commit()
                    now = time.time()
                    for (raw,) in rows:
                        headers = json.loads(raw)
                        written = float(headers[WRITTEN_AT])
                        if written >= since and int(headers[NUMBER]) >= first:
                            latencies.append(now - written)
                            self.arrivals.append(now)
                    if not rows:
                        time.sleep(POLL)
                return latencies
            finally:
                db.close()

        return await asyncio.to_thread(run)

    # one message per transaction -----------------------------------------------------------------

    def take_one(self, db: Any) -> tuple[dict[str, str], bytes] | None:
        """Delete the oldest row in an open transaction (commit/rollback is the caller's)."""
        self._begin(db)
        cursor = db.cursor()
        cursor.execute(self.statements.receive, (1,))
        row = cursor.fetchone()
        if row is None:
            db.rollback()
            return None
        return json.loads(row[2]), bytes(row[3])

    def put_one(self, db: Any, headers: dict[str, str], body: bytes) -> None:
        self._begin(db)
        db.execute(self.statements.send, (str(uuid.uuid4()), None, headers_json(headers), body))
        db.commit()
