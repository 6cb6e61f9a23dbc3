"""The bounded pool of database connections one SQL `Transport` shares among its routes.

Why
    Every route loop has its own sources and sinks, each driven from a thread of its own
    (`connection`). Were each to keep a database connection, a process running a hundred routes
    would hold two to three hundred server connections, past PostgreSQL's default
    `max_connections`. A `Connection` given a pool instead leases a database connection when
    its first statement begins a transaction and gives it back once the transaction has ended
    (committed or rolled back), so a route polling an empty table borrows one only for the
    poll, and a loop holding a received batch keeps its one until the batch is settled.

Bounds
    At most `size` database connections are open at once, leased or idle. A lease that finds
    none idle opens one while fewer than `size` are open, and otherwise waits, first come first
    served, for one to be given back. A wait is bounded by `timeout`: then it raises
    `TransportUnavailable` (retriable), so the batch it was for goes back and the route backs
    off; two loops that each hold a connection of one pool and wait for one of the other's
    cannot wait on each other for longer than that. `free` says whether a lease would get one
    at once (a source receives ahead only then).

Broken connections
    A connection that broke is discarded (closed, not given back), which frees its place for a
    new one. An idle connection the server closed meanwhile is found broken by the next lease's
    first statement: that lease fails (retriable) and the connection is discarded.

Threads
    `lease`, `give_back` and `discard` block and are called from the leasing `Connection`'s own
    thread, so one database connection is used by several threads, one after another, never
    at once. psycopg allows that; so does pyodbc with an ODBC driver (the ODBC specification
    requires drivers to be thread-safe).

Closing
    `close` closes every idle connection, makes every waiting lease fail, and a connection given
    back afterwards is closed instead of kept: once the `Connection`s that hold leases have
    given them back (the transport closes them), nothing of the pool is left open.

SQLite connections are not pooled: a file has no server and no connection limit, and a
`sqlite3` connection belongs to the thread that opened it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable

from bridge.errors import TransportUnavailable
from bridge.transports.sql.dialects.base import DbConnection

__all__ = ["Pool"]


class _Waiter:
    """One lease waiting: handed a connection, or the right to open one (`slot`)."""

    __slots__ = ("db", "event", "slot")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.db: DbConnection | None = None
        self.slot = False


class Pool:
    """At most `size` connections from `connect`, leased one at a time; see the module."""

    def __init__(
        self, connect: Callable[[], DbConnection], size: int, timeout: float, describe: str
    ) -> None:
        if size < 1:
            raise ValueError("a pool holds at least one connection")
        self.size = size
        self.timeout = timeout
        self._connect = connect
        self._describe = describe
        self._lock = threading.Lock()
        self._idle: list[DbConnection] = []  # most recently given back last
        self._open = 0  # leased, idle, or being opened
        self._waiters: deque[_Waiter] = deque()
        self._closed = False

    @property
    def open(self) -> int:
        """Connections open (leased or idle), or being opened."""
        return self._open

    @property
    def idle(self) -> int:
        return len(self._idle)

    def free(self) -> bool:
        """Whether a lease now would get a connection without waiting."""
        return (
            not self._closed and not self._waiters and (bool(self._idle) or self._open < self.size)
        )

    def lease(self) -> DbConnection:
        """A connection for the caller alone until it gives it back or discards it."""
        waiter = None
        with self._lock:
            if self._closed:
                raise TransportUnavailable(f"{self._describe}: closed")
            if not self._waiters and self._idle:
                return self._idle.pop()
            if not self._waiters and self._open < self.size:
                self._open += 1
            else:
                waiter = _Waiter()
                self._waiters.append(waiter)
        if waiter is not None:
            db = self._wait(waiter)
            if db is not None:
                return db
        try:
            return self._connect()
        except BaseException:
            self._free_place()
            raise

    def _wait(self, waiter: _Waiter) -> DbConnection | None:
        """The connection handed to `waiter`, or None when it may open one."""
        deadline = time.monotonic() + self.timeout
        waiter.event.wait(self.timeout)
        with self._lock:
            if not waiter.event.is_set():
                self._waiters.remove(waiter)
                waited = self.timeout - max(0.0, deadline - time.monotonic())
                raise TransportUnavailable(
                    f"{self._describe} unavailable: no free connection in its pool of "
                    f"{self.size} after {waited:.1f} s (raise `pool_size`, or lower the "
                    "routes' concurrency)"
                )
        if waiter.db is None and not waiter.slot:
            raise TransportUnavailable(f"{self._describe}: closed")
        return waiter.db

    def give_back(self, db: DbConnection) -> None:
        """`db`, its transaction ended, is free for the next lease."""
        with self._lock:
            if not self._closed:
                if self._waiters:
                    waiter = self._waiters.popleft()
                    waiter.db = db
                    waiter.event.set()
                else:
                    self._idle.append(db)
                return
            self._open -= 1
        _close(db)

    def discard(self, db: DbConnection) -> None:
        """`db` broke (or cannot be trusted): close it and free its place."""
        _close(db)
        self._free_place()

    def _free_place(self) -> None:
        with self._lock:
            if self._waiters and not self._closed:
                waiter = self._waiters.popleft()
                waiter.slot = True
                waiter.event.set()
            else:
                self._open -= 1

    def close(self) -> None:
        """Close the idle connections; leases waiting fail; what comes back is closed."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            waiters, self._waiters = list(self._waiters), deque()
        for waiter in waiters:
            waiter.event.set()  # neither a connection nor a slot: closed
        for db in idle:
            _close(db)


def _close(db: DbConnection) -> None:
    with contextlib.suppress(Exception):
        db.rollback()
    with contextlib.suppress(Exception):
        db.close()
