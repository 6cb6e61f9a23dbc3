"""One database connection driven from its own single worker thread.

Every blocking driver call of a source, sink or transport goes through `Connection.run`, which
executes it on that connection's one thread. So sqlite3 and pyodbc always see the thread that
opened them, calls on one connection never overlap, and a transaction can stay open across
awaits (a received batch keeps its rows locked until it is settled).

Without a pool (SQLite) the database connection is opened on first use and kept. With one
(PostgreSQL, SQL Server: `bridge.transports.sql.pool`) it is leased when a call finds none in
hand, and given back after every call that leaves no transaction open
(`Dialect.transaction_open`): a transaction holds its connection from its first statement to
its commit or rollback, and nothing longer. A waiting lease blocks this thread only.

A call has a deadline where the dialect sets `response_timeout` (PostgreSQL): one watchdog
thread per process looks at the calls in progress every `WATCH_INTERVAL` seconds and has the
dialect `interrupt` those past it, so a network that stalls without closing the connection
fails the call (`TransportUnavailable`, retriable) instead of blocking its route (or, through
the administration connection, the probes every route makes after a failure) for good.

When a call fails, its transaction is rolled back; when the rollback fails too, or the driver
says the connection broke, the connection is dropped (a pooled one discarded, never given
back) and the next call opens or leases another. Driver exceptions leave as bridge errors
(`bridge.transports.sql.errors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from bridge.errors import TransportError, TransportUnavailable
from bridge.transports.sql.dialects.base import DbConnection, Dialect
from bridge.transports.sql.errors import translated
from bridge.transports.sql.pool import Pool

__all__ = ["WATCH_INTERVAL", "Connection"]

T = TypeVar("T")

#: Seconds between two looks of the watchdog: a call is interrupted at most this late.
WATCH_INTERVAL = 0.5


class _Watchdog:
    """The process's one thread that interrupts calls past their deadline (see the module)."""

    def __init__(self) -> None:
        self._watched: weakref.WeakSet[Connection] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, connection: Connection) -> None:
        with self._lock:
            self._watched.add(connection)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="bridge-sql-watchdog", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(WATCH_INTERVAL)
            with self._lock:
                watched = list(self._watched)
            now = time.monotonic()
            for connection in watched:
                connection.interrupt_if_late(now)


_WATCHDOG = _Watchdog()


class Connection:
    def __init__(
        self,
        dialect: Dialect,
        *,
        receiving: bool = False,
        pool: Pool | None = None,
    ) -> None:
        self._dialect = dialect
        self._receiving = receiving  # a source's: see `Dialect.receiving_session`
        self._pool = pool
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"bridge-{dialect.kind}-{dialect.connection_name}"
        )
        self._db: DbConnection | None = None
        self._closed = False
        #: How many times an open transaction may have been rolled back or the connection
        #: dropped behind its user's back (a failed call, a cancelled one, close). Read on this
        #: connection's thread, it tells whether a transaction begun earlier is still the open one.
        self.resets = 0
        #: Seconds a call may wait for the server (None: forever), and the call in progress:
        #: its deadline and database connection (set and cleared on this connection's thread,
        #: read by the watchdog's).
        self._timeout = dialect.response_timeout
        self._in_call: tuple[float, DbConnection] | None = None
        self._interrupted = False
        if self._timeout is not None:
            _WATCHDOG.watch(self)

    def interrupt_if_late(self, now: float) -> None:
        """On the watchdog's thread: interrupt the call in progress if past its deadline."""
        call = self._in_call
        if call is not None and now >= call[0]:
            self._in_call = None
            self._interrupted = True
            self._dialect.interrupt(call[1])

    async def run(self, work: Callable[[DbConnection], T]) -> T:
        """Run `work(db)` on this connection's thread; driver errors come out translated."""
        if self._closed:
            raise TransportError(f"{self._dialect.describe()}: used after close()")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._call, work)

    def rollback_later(self) -> None:
        """Queue a rollback behind whatever the thread is doing (a cancelled receive's rows)."""
        if not self._closed:
            self._executor.submit(self._roll_back_or_drop)

    def later(self, work: Callable[[DbConnection], object]) -> None:
        """Queue `work(db)` behind whatever the thread is doing, for no one to wait on (what a
        cancelled call leaves to tidy up); a failure rolls back, as in `run`."""
        if not self._closed:
            self._executor.submit(self._call_quietly, work)

    def _call_quietly(self, work: Callable[[DbConnection], object]) -> None:
        with contextlib.suppress(Exception):
            if self._db is not None:
                self._call(work)

    async def close(self) -> None:
        """Roll back anything still open and close (a pooled connection: give it back);
        idempotent."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._release)
        finally:
            self._executor.shutdown(wait=False)

    def _call(self, work: Callable[[DbConnection], T]) -> T:
        self._interrupted = False
        try:
            with translated(self._dialect.describe(), self._dialect.classify):
                db = self._db
                if db is None:
                    db = self._db = self._open()
                result = self._work(work, db)
        except Exception as exc:
            self._roll_back_or_drop()
            if self._interrupted:
                raise TransportUnavailable(
                    f"{self._dialect.describe()}: no answer from the server within "
                    f"{self._timeout:g} s (response_timeout); connection dropped"
                ) from exc
            raise
        if self._pool is not None and not self._dialect.transaction_open(db):
            self._give_back()
        return result

    def _work(self, work: Callable[[DbConnection], T], db: DbConnection) -> T:
        """`work(db)`, under the watchdog's eye when there is a deadline."""
        if self._timeout is None:
            return work(db)
        self._in_call = (time.monotonic() + self._timeout, db)
        try:
            return work(db)
        finally:
            self._in_call = None

    def _open(self) -> DbConnection:
        if self._pool is not None:  # a source's transactions hold theirs while it sends
            return self._pool.lease(holding=self._receiving)
        db = self._dialect.connect()
        if self._receiving:
            try:
                self._dialect.receiving_session(db)
            except BaseException:
                db.close()
                raise
        return db

    def _give_back(self) -> None:
        db, self._db = self._db, None
        if db is not None and self._pool is not None:
            self._pool.give_back(db)

    def _roll_back_or_drop(self) -> None:
        db = self._db
        if db is None:
            return
        self.resets += 1
        try:
            db.rollback()
        except Exception:  # the connection is gone; the server rolls back on its own
            self._drop()
            return
        if not self._dialect.alive(db):
            self._drop()
        elif self._pool is not None:
            self._give_back()

    def _release(self) -> None:
        """At close: roll back; a pooled connection that still works goes back to its pool."""
        if self._pool is not None and self._db is not None:
            self._roll_back_or_drop()
        self._drop()

    def _drop(self) -> None:
        self.resets += 1
        db, self._db = self._db, None
        if db is None:
            return
        if self._pool is not None:
            self._pool.discard(db)
            return
        with contextlib.suppress(Exception):
            db.rollback()
        with contextlib.suppress(Exception):
            db.close()
