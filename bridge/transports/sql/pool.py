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
    off. `free` says whether a lease would get one at once (a source receives ahead only then).

Holding leases, and why sends never wait on them for good
    A source's lease is `holding`: its transaction stays open while its loop sends the batch,
    perhaps into another pool. A sink's is not: its transaction (insert, commit) waits on
    nothing else. A loop of A -> B holds a connection of A and waits for one of B while a loop
    of B -> A holds one of B and waits for one of A; if holding leases could fill both pools,
    each would wait for the other until the timeout, again and again. So holding leases take at
    most `size - 1` connections of a pool (of a pool of one, the one), and the last always
    comes round to a send, which ends and gives it back: every send gets a connection in the
    end, so every held batch is settled in the end.

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
from collections import deque
from collections.abc import Callable

from bridge.errors import TransportUnavailable
from bridge.transports.sql.dialects.base import DbConnection

__all__ = ["Pool"]


class _Waiter:
    """One lease waiting: handed a connection, or the right to open one (`slot`)."""

    __slots__ = ("db", "event", "holding", "slot")

    def __init__(self, holding: bool) -> None:
        self.holding = holding
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
        #: The most connections holding leases may have at once (see the module docstring).
        self.holding_cap = max(1, size - 1)
        self.timeout = timeout
        self._connect = connect
        self._describe = describe
        self._lock = threading.Lock()
        self._idle: list[DbConnection] = []  # most recently given back last
        self._open = 0  # leased, idle, or being opened
        self._held = 0  # holding leases granted, their connection opened or being opened
        self._holders: set[int] = set()  # id() of the connections holding leases have
        self._waiters: deque[_Waiter] = deque()
        self._closed = False

    @property
    def open(self) -> int:
        """Connections open (leased or idle), or being opened."""
        return self._open

    @property
    def idle(self) -> int:
        return len(self._idle)

    def free(self, holding: bool = True) -> bool:
        """Whether a lease now would get a connection without waiting."""
        return not self._closed and self._grantable(holding)

    def _grantable(self, holding: bool) -> bool:
        room = bool(self._idle) or self._open < self.size
        return room and (not holding or self._held < self.holding_cap)

    def _grant(self, holding: bool) -> DbConnection | None:
        """Take an idle connection, or a place to open one (None); under the lock."""
        if holding:
            self._held += 1
        if self._idle:
            return self._idle.pop()
        self._open += 1
        return None

    def lease(self, holding: bool = False) -> DbConnection:
        """A connection for the caller alone until it gives it back or discards it;
        `holding` for a source's (see the module docstring)."""
        with self._lock:
            if self._closed:
                raise TransportUnavailable(f"{self._describe}: closed")
            # Whoever waits cannot be served (see `_dispatch`): no one is passed over.
            if self._grantable(holding):
                db = self._grant(holding)
            else:
                waiter = _Waiter(holding)
                self._waiters.append(waiter)
                db = self._wait(waiter)
            if db is not None:
                if holding:
                    self._holders.add(id(db))
                return db
        try:
            db = self._connect()
        except BaseException:
            with self._lock:
                self._open -= 1
                if holding:
                    self._held -= 1
                self._dispatch()
            raise
        if holding:
            with self._lock:
                self._holders.add(id(db))
        return db

    def _wait(self, waiter: _Waiter) -> DbConnection | None:
        """The connection handed to `waiter`, or None when it got a place to open one; waits
        with the lock released, and returns with it held."""
        self._lock.release()
        try:
            waiter.event.wait(self.timeout)
        finally:
            self._lock.acquire()
        if not waiter.event.is_set():
            self._waiters.remove(waiter)
            raise TransportUnavailable(
                f"{self._describe} unavailable: no free connection in its pool of {self.size} "
                f"after {self.timeout:g} s (raise `pool_size`, or lower the routes' concurrency)"
            )
        if waiter.db is None and not waiter.slot:
            raise TransportUnavailable(f"{self._describe}: closed")
        return waiter.db

    def _dispatch(self) -> None:
        """Serve the waiters that can be served now, first come first served; under the lock.

        Afterwards every waiter left waits for want of a connection (or, holding, for want of
        a place under the cap), which `lease` relies on."""
        while self._waiters and not self._closed:
            waiter = next((w for w in self._waiters if self._grantable(w.holding)), None)
            if waiter is None:
                return
            self._waiters.remove(waiter)
            waiter.db = self._grant(waiter.holding)
            waiter.slot = waiter.db is None
            waiter.event.set()

    def _release(self, db: DbConnection) -> None:
        """`db` is no longer leased; under the lock."""
        if id(db) in self._holders:
            self._holders.discard(id(db))
            self._held -= 1

    def give_back(self, db: DbConnection) -> None:
        """`db`, its transaction ended, is free for the next lease."""
        with self._lock:
            self._release(db)
            if not self._closed:
                self._idle.append(db)
                self._dispatch()
                return
            self._open -= 1
        _close(db)

    def discard(self, db: DbConnection) -> None:
        """`db` broke (or cannot be trusted): close it and free its place."""
        _close(db)
        with self._lock:
            self._release(db)
            self._open -= 1
            self._dispatch()

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
