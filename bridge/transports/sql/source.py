"""`SqlSource`: destructive batched receive from one queue table.

Guarantees
    A receive deletes up to `max_messages` of the oldest rows in one transaction (NGinn's
    layout marks them done instead) and keeps it open until the batch is settled:
    `commit()` commits, `abort()` (or leaving the block, a crash, a lost connection) rolls
    back and every row is back where it was. Concurrent receivers never get the same row.

Expiry and poison
    Expired rows (by the database clock) are taken with the batch and only counted in
    `Batch.expired`. A row whose Headers cannot be read becomes a `PoisonMessage` (raw Headers,
    body) without holding up the rows behind it, and so does a retried error copy of one (a
    row carrying `NServiceBus.Bridge.RawHeaders`, see `bridge.nservicebus.deadletter`). With
    `error_queue` the source inserts its error copies into that table in the same transaction,
    right before COMMIT (`bridge.transports.sql.deadletter`). Poison messages are listed in
    `Batch.poison` either way; without `error_queue`, committing deletes them and they are the
    caller's to keep, unless the layout keeps them in their table (NGinn's `F` rows).

Delayed messages
    A row that still carries `NServiceBus.SqlServer.ForwardDestination` (a delayed message
    moved out of a delayed table) is taken as the NServiceBus receiver takes it: the header
    stripped, and when it names another queue the message is inserted there in the receive's
    transaction instead of going over the route (`bridge.transports.sql.forward`).

Housekeeping
    A layout's housekeeping statements (NGinn's mover and cleanup with `nginn.retries`) run
    every `HOUSEKEEPING_EVERY` seconds before a poll, each in a transaction of its own. One
    that fails (a login without DELETE rights, a lock timeout) is rolled back and logged as a
    warning, and the source goes on receiving; it is tried again at the next run, as NGinn's
    own process does.

Polling
    Each poll is a write transaction, so an idle source polls less and less often: the delay
    between polls doubles from 10 ms to 1 s while no rows come, across receives, and is back to
    10 ms as soon as a poll finds rows (a source that is behind, its batch full, polls again at
    once). A source that has caught up (its batch was not full) waits 10 ms before it polls
    again, so that what comes in at a low rate goes on in batches of 10 ms rather than of a
    row or two (Kafka's producer waits in `linger.ms` for the same reason). With one writer
    (SQLite) the wait also leaves the file's write lock free for the applications writing into
    it. A receive polls when the next poll is due within its timeout, and otherwise waits out
    the timeout; it returns an empty batch without a transaction open. A range source (below)
    polls at once: a range it has caught up with gets no new rows.

Sequence ranges
    A source given `seq_range=(lo, hi)` receives only rows with lo <= seq <= hi (SQL Server:
    RowVersion), oldest first, and is otherwise the same source: same transaction, expiry,
    poison and settle rules. Bulk jobs (`bridge.migrate`) split a backlog into such ranges and
    run one source per range in parallel, next to the service's own receivers (which skip the
    rows a range source holds, and vice versa); `bridge.transports.sql.ranges` reads the
    sequence without taking anything.

Receiving ahead
    Where two transactions can delete from one table at once (PostgreSQL, SQL Server: not
    SQLite, and not for a source whose sink writes in its transaction), a source may receive
    one more batch while it holds one (`receives_ahead`): the second is taken on a second
    connection, and skips the rows the first holds. The runner uses it to receive the next
    batch while the current one is being sent, and still sends and commits them one after the
    other, in order. Where only one transaction can write (SQLite), the source receives ahead
    in the transaction it holds instead (`bridge.transports.sql.chain`).

Connections
    A source's connections come from its transport's pool where it has one (PostgreSQL, SQL
    Server: `bridge.transports.sql.pool`): a poll leases one for its transaction and gives it
    back when it finds nothing, a batch keeps it until settled (a holding lease: sources have
    at most all but one of the pool). A source holding a batch receives ahead only while the
    pool has a connection free for it at once (`receives_ahead`), so a loop never waits for a
    second connection while it holds one. A source's commits do not
    wait for the log flush (`Dialect.receiving_transaction`, `Dialect.receiving_session`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from bridge.batch import Batch, Rejected
from bridge.envelope import Envelope, PoisonMessage
from bridge.errors import SettleError, TransportError
from bridge.nservicebus.deadletter import returned_poison
from bridge.transports.sql.chain import CHAIN, Chain, Link, in_new_transaction
from bridge.transports.sql.connection import Connection
from bridge.transports.sql.deadletter import ErrorQueue
from bridge.transports.sql.dialects.base import DbConnection, Dialect
from bridge.transports.sql.forward import Forwards
from bridge.transports.sql.layouts.base import TakenRow
from bridge.transports.sql.pool import Pool
from bridge.transports.sql.ranges import ranged
from bridge.transports.sql.sink import SqlSink

__all__ = ["HOUSEKEEPING_EVERY", "MAX_POLL", "MIN_POLL", "SqlSource"]

log = logging.getLogger(__name__)

MIN_POLL = 0.01
MAX_POLL = 1.0
#: Seconds between two runs of the layout's housekeeping (NGinn's mover: about every 8 s).
HOUSEKEEPING_EVERY = 8.0


def _roll_back(db: DbConnection) -> None:
    db.rollback()


@dataclass
class _Taken:
    messages: list[Envelope]
    poison: list[PoisonMessage]
    expired: int


class SqlSource:
    """Destructive batched receive from one queue table; see the module docstring."""

    def __init__(
        self,
        dialect: Dialect,
        address: str,
        error_queue: str | None = None,
        *,
        seq_range: tuple[int, int] | None = None,
        pool: Pool | None = None,
    ) -> None:
        self._dialect = dialect
        self._pool = pool
        self._address = address
        layout = dialect.layout
        self._receive = dialect.queue_statements(address).receive
        self._receive_params: tuple[object, ...] = layout.receive_params(address)
        self._ranged = seq_range is not None
        if seq_range is not None:
            self._receive = ranged(dialect, address, "receive_range")
            self._receive_params += seq_range
        self._housekeeping = layout.housekeeping(address)
        self._next_housekeeping = 0.0  # time.monotonic(); 0: at the first poll
        self._copies = ErrorQueue(dialect, address, error_queue)
        self._forwards = Forwards(dialect, address)
        self._connection = Connection(dialect, receiving=True, pool=pool)
        self._ahead: Connection | None = None  # the second, for a receive ahead of a held batch
        self._in_use: set[Connection] = set()  # receiving, or holding a batch's transaction
        self._borrowed = False  # a sink writes in this source's transactions
        self._poll_delay = MIN_POLL  # after the next empty poll
        self._next_poll = 0.0  # loop time; 0: now
        self._chain = Chain(dialect, address, self._connection, self._copies)

    @property
    def receives_ahead(self) -> bool:
        """Whether one more batch may be received now, while one is held.

        Where two transactions can write, on a second connection, while the pool (if any) has
        one free at once. With one writer (SQLite), while the open transaction holds fewer than
        `CHAIN` batches and a batch is held (`bridge.transports.sql.chain`). Never when a sink
        writes in this source's transaction (it follows one connection).
        """
        if self._borrowed:
            return False
        if self._dialect.concurrent_writers:
            return self._pool is None or self._pool.free()
        return self._chain.ahead_allowed()

    @property
    def _chaining(self) -> bool:
        return not self._dialect.concurrent_writers and not self._borrowed

    async def receive_batch(self, max_messages: int, timeout: float) -> Batch:
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        if self._chaining:
            return await self._receive_chained(max_messages, timeout)
        connection = self._free_connection()
        self._in_use.add(connection)
        batch: Batch | None = None
        try:
            batch = await self._poll(connection, max_messages, timeout)
        finally:
            if batch is None:  # nothing taken: no transaction held
                self._in_use.discard(connection)
        return batch if batch is not None else Batch()

    async def _receive_chained(self, max_messages: int, timeout: float) -> Batch:
        chain = self._chain
        if chain.receiving or chain.held >= CHAIN:
            raise SettleError("receive_batch called before the previous batch was settled")
        chain.receiving = True
        try:
            if chain.held:  # a batch of the open transaction is held: the next one, in it
                taken, link = await self._take(self._connection, max_messages, ahead=True)
                return Batch() if taken is None else self._batch(self._connection, taken, link)
            batch = await self._poll(self._connection, max_messages, timeout)
            return Batch() if batch is None else batch
        finally:
            chain.receiving = False

    def _free_connection(self) -> Connection:
        if self._connection not in self._in_use:
            return self._connection
        if not self._borrowed and self._dialect.concurrent_writers:
            if self._ahead is None:
                self._ahead = Connection(self._dialect, receiving=True, pool=self._pool)
            if self._ahead not in self._in_use:
                return self._ahead
        raise SettleError("receive_batch called before the previous batch was settled")

    async def _poll(
        self, connection: Connection, max_messages: int, timeout: float
    ) -> Batch | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.0)
        while True:
            if self._next_poll > deadline:
                await asyncio.sleep(max(0.0, deadline - loop.time()))
                return None
            wait = self._next_poll - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if self._housekeeping and time.monotonic() >= self._next_housekeeping:
                self._next_housekeeping = time.monotonic() + HOUSEKEEPING_EVERY
                await self._housekeep(connection)
            taken, link = await self._take(connection, max_messages)
            if taken is not None:
                self._poll_delay, self._next_poll = MIN_POLL, 0.0
                caught_up = len(taken.messages) + len(taken.poison) + taken.expired < max_messages
                if caught_up and not self._ranged:  # see "Polling"
                    self._next_poll = loop.time() + MIN_POLL
                return self._batch(connection, taken, link)
            self._next_poll = loop.time() + self._poll_delay
            self._poll_delay = min(self._poll_delay * 2, MAX_POLL)

    async def _housekeep(self, connection: Connection) -> None:
        """The layout's housekeeping statements, each in a transaction of its own (no batch
        of this source is open on this connection: a poll only runs between batches). A
        failure is rolled back (`Connection.run`) and logged, not raised: NGinn logs its
        mover's and cleanup's errors and goes on (SqlMessageTransport2.cs:936-940, 1007-1011),
        and the rows to receive do not wait for either."""
        for statement in self._housekeeping:
            try:
                await connection.run(partial(self._housekeep_one, statement))
            except TransportError as exc:
                log.warning(
                    "%s: housekeeping of %r failed, tried again in %g s: %s",
                    self._dialect.describe(),
                    self._address,
                    HOUSEKEEPING_EVERY,
                    exc,
                )

    def _housekeep_one(self, statement: str, db: DbConnection) -> None:
        self._dialect.begin(db)
        db.cursor().execute(statement)
        db.commit()

    async def close(self) -> None:
        await self._connection.close()
        if self._ahead is not None:
            await self._ahead.close()

    def sink_in_transaction(self, address: str) -> SqlSink:
        """A sink into another table of this database that writes inside each received batch's
        transaction: the batch's commit moves the rows atomically (exactly-once), and a route
        between two tables of one SQLite file cannot wait on its own write lock."""
        self._borrowed = True
        return SqlSink(self._dialect, address, borrowed=self._connection)

    async def _take(
        self, connection: Connection, max_messages: int, ahead: bool = False
    ) -> tuple[_Taken | None, Link | None]:
        receive = partial(self._receive_rows, max_messages)
        if self._chaining:
            return await self._chain.take(receive, ahead=ahead)
        try:
            return await connection.run(partial(in_new_transaction, self._dialect, receive)), None
        except asyncio.CancelledError:
            # The thread may have deleted rows nobody will settle: give them back.
            connection.rollback_later()
            raise

    def _receive_rows(self, max_messages: int, db: DbConnection) -> _Taken | None:
        """Delete up to `max_messages` of the oldest rows in the open transaction."""
        cursor = db.cursor()
        cursor.execute(self._receive, (*self._receive_params, max_messages))
        rows = self._dialect.layout.received_rows(self._dialect.fetch(cursor))
        if not rows:
            return None
        self._dialect.receiving_transaction(db)
        return self._taken(rows, db)

    def _taken(self, rows: Sequence[TakenRow], db: DbConnection) -> _Taken:
        layout = self._dialect.layout
        now = time.time()
        taken = _Taken([], [], 0)
        for row in rows:
            if row.expired:
                taken.expired += 1
                continue
            message: Envelope | PoisonMessage | None = layout.incoming(row, now)
            if isinstance(message, Envelope):
                message = returned_poison(message) or self._forwards.take(message, db)
                # None: sent on to the queue it names, in this transaction
            if isinstance(message, PoisonMessage):
                taken.poison.append(message)
            elif message is not None:
                taken.messages.append(message)
        return taken

    def _batch(self, connection: Connection, taken: _Taken, link: Link | None) -> Batch:
        rejected: list[Rejected] = []

        async def commit() -> None:
            if link is not None:
                await self._chain.commit(link, taken.poison, rejected)
            else:
                await self._settle(connection, partial(self._commit, taken.poison, rejected))

        async def abort() -> None:
            self._next_poll = 0.0  # its rows are back: poll again at once
            if link is not None:
                await self._chain.abort(link)
            else:
                await self._settle(connection, _roll_back)

        return Batch(
            taken.messages,
            poison=taken.poison,
            expired=taken.expired,
            on_commit=commit,
            on_abort=abort,
            rejected=rejected,
        )

    async def _settle(self, connection: Connection, work: Callable[[DbConnection], None]) -> None:
        """Commit or roll back a batch's own transaction; the connection is free after."""
        try:
            await connection.run(work)
        finally:
            self._in_use.discard(connection)

    def _commit(
        self, poison: Sequence[PoisonMessage], rejected: Sequence[Rejected], db: DbConnection
    ) -> None:
        self._copies.write(poison, rejected, db)
        db.commit()
