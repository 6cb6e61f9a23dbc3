"""The SQL queue-table transport, shared by every dialect: sources, sinks, install, peek.

Guarantees
    A receive deletes up to `max_messages` of the oldest rows in one transaction and keeps it
    open until the batch is settled: `commit()` commits, `abort()` (or leaving the block, a
    crash, a lost connection) rolls back and every row is back where it was. Concurrent
    receivers never get the same row. A send inserts the whole list in one transaction and
    returns only after COMMIT; with a checkpoint, the source positions are upserted into
    `BridgeCheckpoints` in that same transaction (Kafka -> SQL exactly-once). A sink told
    `fence_checkpoint` writes a position only over the one it expects, so that of two writers
    of one position (two attempts of one bulk task) only one commits (`CheckpointConflict`).
    A message whose headers no row can hold (a lone surrogate) raises `MessageRejected` with
    its index before anything is written, so the runner sends it to the error queue and the
    rest on. A `FencedCheckpoint` (a Kafka source's batch) is written the same way over the
    positions its batch started from; a conflict there is `PositionMoved`, retriable: the
    source receives again from the stored positions.

Expiry and poison
    Expired rows (by the database clock) are deleted with the batch and only counted in
    `Batch.expired`. A row whose Headers cannot be read becomes a `PoisonMessage` (raw Headers,
    body) without holding up the rows behind it, and so does a retried error copy of one (a
    row carrying `NServiceBus.Bridge.RawHeaders`, see `bridge.nservicebus.deadletter`). With
    `error_queue` the source inserts its error copy (`bridge.nservicebus.deadletter.error_copy`:
    body unchanged, the raw Headers text in that header, the failure headers) into that table in
    the same transaction, right before COMMIT. Poison messages are listed in `Batch.poison`
    either way; without `error_queue`, committing deletes them and they are the caller's to
    keep.

Polling
    Each poll is a write transaction, so an idle source polls less and less often: the delay
    between polls doubles from 10 ms to 1 s while no rows come, across receives, and is back to
    10 ms as soon as a poll finds rows (a source that is behind, its batch full, polls again at
    once). A source that has caught up (its batch was not full) waits 10 ms before it polls
    again, so that what comes in at a low rate goes on in batches of 10 ms, not of whatever the
    last few ms brought: at 1,000 msg/s a PostgreSQL source that polled at once took 2-6 rows
    a transaction (by how fast the host was), and sent them into Kafka as record batches of
    one record each; waiting, it takes 12-13, at most 10 ms later (Kafka's own producer waits
    5 ms for the same reason since Kafka 4.0, `linger.ms`). With one writer (SQLite) the wait
    also leaves the file's write lock free: polled at once, the source would hold it nearly all
    the time, and an application writing into the file would get in only after its busy
    handler had backed off for tens of ms. A receive polls when the next poll is due within
    its timeout, and otherwise waits out the timeout; it returns an empty batch without a
    transaction open. A bulk job's range source (below) polls at once: a range it has caught
    up with gets no new rows.

Sequence ranges
    A source given `seq_range=(lo, hi)` receives only rows with lo <= seq <= hi (SQL Server:
    RowVersion), oldest first, and is otherwise the same source: same transaction, expiry,
    poison and settle rules. Bulk jobs (`bridge.migrate`) split a backlog into such ranges and
    run one source per range in parallel, next to the service's own receivers (which skip the
    rows a range source holds, and vice versa). `bounds`, `count_range` and `scan_range` read
    the sequence without taking anything.

Receiving ahead
    Where two transactions can delete from one table at once (PostgreSQL, SQL Server: not
    SQLite, and not for a source whose sink writes in its transaction), a source may receive
    one more batch while it holds one (`receives_ahead`): the second is taken on a second
    connection, opened when first needed, and skips the rows the first holds. The runner uses
    it to receive the next batch while the current one is being sent, and still sends and
    commits them one after the other, in order.

Chained batches
    Where only one transaction can write (SQLite), a source cannot receive ahead on a second
    connection: it receives ahead in the transaction it holds, each batch after a savepoint,
    up to `CHAIN` batches per transaction (none more once it has been open `CHAIN_SECONDS`).
    Settling a batch settles it in that transaction; once every batch in it is settled, the
    transaction writes their error copies and commits. Aborting a batch rolls back to its
    savepoint (the first: the whole transaction), which returns its rows and those of any batch
    taken after it, and commits the batches before it when none of them is left unsettled. The
    runner settles batches in the order they were received, so a SQLite source reads the next
    rows while the batch before them is sent, and commits once per transaction, not once per
    batch (a SQLite commit of a batch costs about as much as its receive: into Kafka,
    24,000 msg/s at 4 batches per transaction, 31,000 at 16). A crash returns every batch of
    the open transaction, settled ones too: up to `CHAIN` batches (at most `CHAIN_SECONDS` of
    them) come back as duplicates, where a source that commits each batch returns one. A
    source that is not behind takes one batch per transaction: the receive ahead finds
    nothing and the batch commits as it settles.

Each source and sink owns one connection (a source receiving ahead: two), driven from its own
thread (`bridge.transports.sql.connection`); the transport keeps one more for
install/check/peek.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from bridge.batch import Batch, Rejected
from bridge.envelope import Envelope, PoisonMessage
from bridge.errors import HeadersFormatError, MessageRejected, SettleError, TransportError
from bridge.nservicebus.deadletter import error_copy, returned_poison
from bridge.nservicebus.wireformat import timestamp_seconds
from bridge.protocols import Checkpoint, CheckpointStore, FencedCheckpoint, QueueStats
from bridge.transports.sql import headers as headers_codec
from bridge.transports.sql.connection import Connection
from bridge.transports.sql.dialect import DbConnection, DbCursor, Dialect, scalar
from bridge.transports.sql.layout import QueueRow, ScannedRow, new_ids

__all__ = [
    "CheckpointConflict",
    "PositionMoved",
    "SqlSink",
    "SqlSource",
    "SqlTransport",
]

MIN_POLL = 0.01
MAX_POLL = 1.0
#: At most this many batches, and no more once it has been open CHAIN_SECONDS, does a source
#: with one writer (SQLite) take in one transaction (see "Chained batches").
CHAIN = 16
CHAIN_SECONDS = 0.5
#: A send of at least this many rows is staged where the dialect can (`Dialect.stage_rows`).
STAGE_FROM = 64
TIME_SENT = "NServiceBus.TimeSent"

T = TypeVar("T")


class CheckpointConflict(TransportError):
    """A fenced checkpoint write found another writer's position: the send was rolled back."""


class PositionMoved(CheckpointConflict):
    """A `FencedCheckpoint`'s batch is stale: another consumer of its partitions stored a
    position first. Retriable: the source receives again from the stored positions."""

    retriable = True


@dataclass(eq=False)
class _Chain:
    """The open transaction of a chaining source and the batches taken in it, in order.
    Read and written only on the source connection's thread."""

    resets: int  # the connection's `resets` when it began: another value, it was rolled back
    links: list[_Link] = field(default_factory=list)

    def held(self) -> bool:
        return any(link.state == "held" for link in self.links)


@dataclass(eq=False)
class _Link:
    """One batch of a `_Chain`: `held` until settled, `gone` once rolled back."""

    chain: _Chain
    index: int  # in `chain.links`; a batch after the first has savepoint `_savepoint(index)`
    state: str = "held"
    # Settled with these to copy to the error queue: written right before the commit, since
    # written at once they would follow the savepoint of a later batch and go with it.
    poison: Sequence[PoisonMessage] = ()
    rejected: Sequence[Rejected] = ()


def _resolve_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _savepoint(index: int) -> str:
    return f"bridge_batch_{index}"


@dataclass
class _Taken:
    messages: list[Envelope]
    poison: list[PoisonMessage]
    expired: int
    link: _Link | None = None  # a chaining source's


class SqlSource:
    """Destructive batched receive from one queue table; see the module docstring."""

    def __init__(
        self,
        dialect: Dialect,
        address: str,
        error_queue: str | None = None,
        *,
        seq_range: tuple[int, int] | None = None,
    ) -> None:
        self._dialect = dialect
        self._address = address
        self._statements = dialect.queue_statements(address)
        self._receive = self._statements.receive
        self._receive_params: tuple[int, ...] = ()
        if seq_range is not None:
            self._receive, self._receive_params = self._statements.receive_range, seq_range
        self._error_queue = error_queue
        if error_queue is not None:
            dialect.table(error_queue)  # an impossible name fails now, not at the first poison
        self._connection = Connection(dialect, receiving=True)
        self._ahead: Connection | None = None  # the second, for a receive ahead of a held batch
        self._in_use: set[Connection] = set()  # receiving, or holding a batch's transaction
        self._borrowed = False  # a sink writes in this source's transactions
        self._poll_delay = MIN_POLL  # after the next empty poll
        self._next_poll = 0.0  # loop time; 0: now
        self._chain: _Chain | None = None  # a chaining source's open transaction (its thread)
        self._chained = 0  # batches in it, as the last call on the thread said
        self._chain_began = 0.0  # time.monotonic() when its first batch was taken
        self._chain_receiving = False
        self._receive_begun: asyncio.Future[None] | None = None

    @property
    def receive_begun(self) -> asyncio.Future[None] | None:
        """Resolved once the last receive asked for is about to run its statement on its
        connection's thread (None before the first): after the transaction's `BEGIN` or the
        batch's `SAVEPOINT`. A loop that receives ahead waits for it before it sends: the send
        lays out its records without yielding the interpreter lock (a few ms for a batch of
        500), and a receive whose thread needed the lock meanwhile, for any line of Python on
        its way to the statement, would wait for it (up to the 5 ms switch interval, each
        time), instead of running its statement (which does not hold the lock) beside the
        send."""
        return self._receive_begun

    @property
    def receives_ahead(self) -> bool:
        """Whether one more batch may be received now, while one is held.

        Where two transactions can write, always (on a second connection). With one writer
        (SQLite), while the open transaction holds fewer than `CHAIN` batches and a batch is
        held (see "Chained batches"). Never when a sink writes in this source's transaction
        (it follows one connection).
        """
        if self._borrowed:
            return False
        if self._dialect.concurrent_writers:
            return True
        return (
            0 < self._chained < CHAIN
            and not self._chain_receiving
            and time.monotonic() - self._chain_began < CHAIN_SECONDS
        )

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
        if self._chain_receiving or self._chained >= CHAIN:
            raise SettleError("receive_batch called before the previous batch was settled")
        self._chain_receiving = True
        try:
            if self._chained:  # a batch of the open transaction is held: the next one, in it
                taken = await self._take(self._connection, max_messages, ahead=True)
                return Batch() if taken is None else self._batch(self._connection, taken)
            batch = await self._poll(self._connection, max_messages, timeout)
            return Batch() if batch is None else batch
        finally:
            self._chain_receiving = False

    def _free_connection(self) -> Connection:
        if self._connection not in self._in_use:
            return self._connection
        if self.receives_ahead:
            if self._ahead is None:
                self._ahead = Connection(self._dialect, receiving=True)
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
            taken = await self._take(connection, max_messages)
            if taken is not None:
                self._poll_delay, self._next_poll = MIN_POLL, 0.0
                caught_up = len(taken.messages) + len(taken.poison) + taken.expired < max_messages
                if caught_up and not self._receive_params:  # not a range: see "Polling"
                    self._next_poll = loop.time() + MIN_POLL
                return self._batch(connection, taken)
            self._next_poll = loop.time() + self._poll_delay
            self._poll_delay = min(self._poll_delay * 2, MAX_POLL)

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
    ) -> _Taken | None:
        loop = asyncio.get_running_loop()
        begun = self._receive_begun = loop.create_future()

        def announce() -> None:  # on the thread, right before the receive's statement
            with contextlib.suppress(RuntimeError):  # the loop closed: no one waits any more
                loop.call_soon_threadsafe(_resolve_once, begun)

        if not self._chaining:
            try:
                return await connection.run(partial(self._delete_oldest, max_messages, announce))
            except asyncio.CancelledError:
                # The thread may have deleted rows nobody will settle: give them back.
                connection.rollback_later()
                raise
        before = self._chained if ahead else 0
        try:
            taken, self._chained = await connection.run(
                partial(self._chain_take, max_messages, ahead, announce)
            )
            if not ahead and taken is not None:
                self._chain_began = time.monotonic()
        except asyncio.CancelledError:
            # The thread may have taken a batch nobody will settle: return just that one.
            connection.later(partial(self._drop_taken_after, before))
            raise
        except BaseException:
            self._chained = 0  # the failed call rolled the transaction back
            raise
        return taken

    def _delete_oldest(
        self, max_messages: int, announce: Callable[[], None], db: DbConnection
    ) -> _Taken | None:
        """Begin a transaction and take the oldest rows in it; none: rolled back, None."""
        self._dialect.begin(db)
        taken = self._receive_rows(max_messages, announce, db)
        if taken is None:
            db.rollback()
        return taken

    def _receive_rows(
        self, max_messages: int, announce: Callable[[], None], db: DbConnection
    ) -> _Taken | None:
        """Delete up to `max_messages` of the oldest rows in the open transaction; `announce()`
        right before the statement (see `receive_begun`)."""
        cursor = db.cursor()
        announce()
        cursor.execute(self._receive, (*self._receive_params, max_messages))
        rows = self._dialect.layout.received_rows(self._dialect.fetch(cursor))
        return self._taken(rows) if rows else None

    # -- chained batches (one writer), on the connection's thread ------------------------------

    def _open_chain(self) -> _Chain | None:
        chain = self._chain
        if chain is not None and chain.resets != self._connection.resets:
            chain = self._chain = None  # rolled back under it (a failed call, a cancel)
        return chain

    def _chain_take(
        self,
        max_messages: int,
        ahead: bool,
        announce: Callable[[], None],
        db: DbConnection,
    ) -> tuple[_Taken | None, int]:
        """(the batch taken, or None; how many batches the open transaction then holds)."""
        chain = self._open_chain()
        if not ahead:
            if chain is not None:
                raise SettleError("a new transaction was begun while one holds a batch")
            taken = self._delete_oldest(max_messages, announce, db)
            if taken is None:
                return None, 0
            chain = self._chain = _Chain(self._connection.resets)
        else:
            if chain is None or not chain.held():  # settled and committed in the meantime
                return None, 0 if chain is None else len(chain.links)
            cursor = db.cursor()
            savepoint = _savepoint(len(chain.links))
            cursor.execute(f"SAVEPOINT {savepoint}")
            taken = self._receive_rows(max_messages, announce, db)
            if taken is None:
                cursor.execute(f"RELEASE {savepoint}")
                return None, len(chain.links)
        taken.link = _Link(chain, len(chain.links))
        chain.links.append(taken.link)
        return taken, len(chain.links)

    def _settle_link(
        self,
        link: _Link,
        poison: Sequence[PoisonMessage],
        rejected: Sequence[Rejected],
        db: DbConnection,
    ) -> int:
        """Settle one batch in the open transaction; commit it when none is left held.
        Returns how many batches the open transaction then holds (0: committed)."""
        chain = self._open_chain()
        if chain is not link.chain or link.state != "held":
            raise TransportError(
                f"{self._dialect.describe()}: the transaction holding this batch of "
                f"{self._address!r} was rolled back; its rows are back in the table"
            )
        self._refuse_rejected_without_error_queue(rejected)  # now: it fails this batch only
        link.state, link.poison, link.rejected = "settled", poison, rejected
        if chain.held():
            return len(chain.links)
        return self._commit_chain(chain, db)

    def _commit_chain(self, chain: _Chain, db: DbConnection) -> int:
        """Every batch of the transaction is settled: write their error copies, commit."""
        for link in chain.links:
            self._write_error_copies(link.poison, link.rejected, db)
        db.commit()
        self._chain = None
        return 0

    def _abort_link(self, link: _Link, db: DbConnection) -> int:
        chain = self._open_chain()
        if chain is not link.chain or link.state != "held":
            return 0 if chain is None else len(chain.links)  # its rows are back already
        return self._unlink(chain, link.index, db)

    def _drop_taken_after(self, count: int, db: DbConnection) -> None:
        """Return the batch a cancelled receive took, if it took one: the `count`-th."""
        chain = self._open_chain()
        if chain is not None and len(chain.links) > count:
            self._unlink(chain, count, db)

    def _unlink(self, chain: _Chain, index: int, db: DbConnection) -> int:
        """Roll back batch `index` and those after it; commit the ones before it when none of
        them is held. Returns how many batches the open transaction then holds."""
        for gone in chain.links[index:]:
            gone.state = "gone"
        del chain.links[index:]
        if index == 0:
            db.rollback()
            self._chain = None
            return 0
        cursor = db.cursor()
        cursor.execute(f"ROLLBACK TO {_savepoint(index)}")
        cursor.execute(f"RELEASE {_savepoint(index)}")
        if chain.held():
            return len(chain.links)
        return self._commit_chain(chain, db)

    # ------------------------------------------------------------------------------------------

    def _taken(self, rows: Sequence[QueueRow]) -> _Taken:
        layout = self._dialect.layout
        now = time.time()
        taken = _Taken([], [], 0)
        for row in rows:
            if row.expired:
                taken.expired += 1
                continue
            message = layout.incoming(row, now)
            if isinstance(message, Envelope):
                message = returned_poison(message) or message
            if isinstance(message, PoisonMessage):
                taken.poison.append(message)
            else:
                taken.messages.append(message)
        return taken

    def _batch(self, connection: Connection, taken: _Taken) -> Batch:
        rejected: list[Rejected] = []
        link = taken.link
        settle: Callable[[Callable[[DbConnection], Any]], Awaitable[None]]
        if link is None:
            commit_work: Callable[[DbConnection], Any] = partial(
                self._commit, taken.poison, rejected
            )
            abort_work: Callable[[DbConnection], Any] = _roll_back
            settle = partial(self._settle_own, connection)
        else:
            commit_work = partial(self._settle_link, link, taken.poison, rejected)
            abort_work = partial(self._abort_link, link)
            settle = partial(self._settle_chained, connection)

        async def commit() -> None:
            await settle(commit_work)

        async def abort() -> None:
            self._next_poll = 0.0  # its rows are back: poll again at once
            await settle(abort_work)

        return Batch(
            taken.messages,
            poison=taken.poison,
            expired=taken.expired,
            on_commit=commit,
            on_abort=abort,
            rejected=rejected,
        )

    async def _settle_own(
        self, connection: Connection, work: Callable[[DbConnection], Any]
    ) -> None:
        """Commit or roll back a batch's own transaction; the connection is free after."""
        try:
            await connection.run(work)
        finally:
            self._in_use.discard(connection)

    async def _settle_chained(
        self, connection: Connection, work: Callable[[DbConnection], int]
    ) -> None:
        """Settle a batch of the open transaction; `work` says how many batches it then holds."""
        try:
            self._chained = await connection.run(work)
        except BaseException:
            self._chained = 0  # the failed call rolled the transaction back
            raise

    def _commit(
        self, poison: Sequence[PoisonMessage], rejected: Sequence[Rejected], db: DbConnection
    ) -> None:
        self._write_error_copies(poison, rejected, db)
        db.commit()

    def _refuse_rejected_without_error_queue(self, rejected: Sequence[Rejected]) -> None:
        if rejected and self._error_queue is None:
            raise TransportError("messages were rejected but this source has no error queue")

    def _write_error_copies(
        self, poison: Sequence[PoisonMessage], rejected: Sequence[Rejected], db: DbConnection
    ) -> None:
        self._refuse_rejected_without_error_queue(rejected)  # the failed call rolls back
        if (poison or rejected) and self._error_queue is not None:
            statement = self._dialect.send_statement(db, self._error_queue)
            failed_q = self._dialect.canonical_address(self._address)
            now = time.time()
            outgoing, send_params = self._dialect.layout.outgoing, self._dialect.send_params
            copies = [error_copy(p, p.reason, failed_q) for p in poison]
            copies += [error_copy(r.envelope, r.error, failed_q) for r in rejected]
            rows = [send_params(outgoing(copy, now)) for copy in copies]
            db.cursor().executemany(statement, rows)


class SqlSink:
    """Inserts envelopes as an NServiceBus endpoint would; one transaction per `send`.

    A send of `STAGE_FROM` rows or more goes through the dialect's send stage where it has one
    (PostgreSQL: a binary COPY into a temporary table, then one INSERT ... SELECT in order),
    which lays the rows out in the driver's C code instead of running Python per row; fewer
    rows take one pipelined `executemany`, which costs fewer round trips. Each staged send
    creates the stage in its transaction unless the session has it (a rollback drops one it
    created; a pooler may hand the next transaction another session).

    A row the database refuses for good (a data exception, see `errors.py`) fails the whole
    send with `MessageRejected` without an index, so the runner sends each message alone.

    A sink on a `borrowed` connection (`SqlSource.sink_in_transaction`) writes into the
    transaction its source has open and leaves the commit to that source's batch. A refused
    row there is a plain `TransportError`: the failed insert rolled back the source's
    transaction with it, so the batch can only be aborted, not sent again in parts.
    """

    def __init__(self, dialect: Dialect, address: str, borrowed: Connection | None = None) -> None:
        self._dialect = dialect
        self._address = address
        dialect.table(address)
        self._checkpoints = dialect.checkpoint_statements()
        self._checkpoint_table_ready = False
        self._fence: dict[str, int | None] | None = None
        self._borrowed = borrowed is not None
        self._connection = borrowed or Connection(dialect)
        # Where the dialect stages sends (see `STAGE_FROM`): the insert from the stage.
        staged = dialect.queue_statements(address).send_staged if dialect.send_stage else ""
        self._staged = "" if self._borrowed else staged

    def fence_checkpoint(self, stored: Mapping[str, int | None]) -> None:
        """From now on, store a position only over the one expected: at first `stored[name]`
        (None or absent: no row yet), then the one this sink committed last. When another
        writer got there first, the send rolls back and raises `CheckpointConflict`."""
        if self._borrowed:
            raise ValueError("a sink in its source's transaction cannot fence its checkpoint")
        self._fence = dict(stored)

    async def send(
        self, envelopes: Sequence[Envelope], checkpoint: Checkpoint | None = None
    ) -> None:
        if not envelopes and not checkpoint:
            return
        positions = list((checkpoint or {}).items())
        expected = checkpoint.expected if isinstance(checkpoint, FencedCheckpoint) else None
        try:
            rejected = await self._connection.run(
                partial(self._insert, list(envelopes), positions, expected)
            )
        except MessageRejected as exc:
            if self._borrowed:
                raise TransportError(str(exc)) from exc
            raise
        if rejected is not None:
            raise rejected

    async def load_checkpoint(self, prefix: str) -> dict[str, int]:
        """Stored positions whose names start with `prefix` (empty before the first one)."""
        return await self._connection.run(partial(self._load_checkpoint, prefix))

    async def close(self) -> None:
        if not self._borrowed:
            await self._connection.close()

    def _insert(
        self,
        envelopes: list[Envelope],
        positions: list[tuple[str, int]],
        expected: Mapping[str, int | None] | None,
        db: DbConnection,
    ) -> MessageRejected | None:
        """Insert the rows; a message no row can hold is returned, not raised, before anything
        is written: raising would roll back the connection, which on a borrowed one is the
        source's batch, while the runner goes on to send the rest of that batch. `expected`
        (a `FencedCheckpoint`'s starting positions) fences the positions written."""
        now = time.time()
        send_params, outgoing = self._dialect.send_params, self._dialect.layout.outgoing
        rows = []
        for index, (envelope, native_id) in enumerate(
            zip(envelopes, new_ids(len(envelopes)), strict=True)
        ):
            try:
                rows.append(send_params(outgoing(envelope, now, native_id)))
            except HeadersFormatError as exc:
                where = f"{self._dialect.describe()}: table {self._address!r}"
                return MessageRejected(f"{where}: {exc}", index=index)
        if positions and not self._checkpoint_table_ready:
            self._create_checkpoint_table(db)
        staged = self._staged and len(rows) >= STAGE_FROM
        if not self._borrowed:
            self._dialect.begin(db)
        cursor = db.cursor()
        if staged:
            self._dialect.stage_rows(db, rows)
            cursor.execute(self._staged)
        elif rows:
            cursor.executemany(self._dialect.send_statement(db, self._address), rows)
        if positions and expected is not None:
            self._write_fenced(cursor, expected, positions, PositionMoved)
        elif positions and self._fence is not None:
            self._write_fenced(cursor, self._fence, positions)
        elif positions:
            cursor.executemany(self._checkpoints.upsert, positions)
        if not self._borrowed:
            db.commit()
        if positions and expected is None and self._fence is not None:
            self._fence.update(positions)
        return None

    def _write_fenced(
        self,
        cursor: DbCursor,
        fence: Mapping[str, int | None],
        positions: list[tuple[str, int]],
        conflict: type[CheckpointConflict] = CheckpointConflict,
    ) -> None:
        new = [(name, position) for name, position in positions if fence.get(name) is None]
        moved = [(p, name, fence[name]) for name, p in positions if fence.get(name) is not None]
        for statement, rows, names in (
            (self._checkpoints.insert_new, new, [name for name, _ in new]),
            (self._checkpoints.advance, moved, [name for _, name, _ in moved]),
        ):
            if not rows:
                continue
            if self._dialect.summed_rowcount:  # one call per kind, not a round trip per position
                cursor.executemany(statement, rows)
                if cursor.rowcount != len(rows):
                    raise self._fence_conflict(conflict, fence, names)
                continue
            for row, name in zip(rows, names, strict=True):
                cursor.execute(statement, row)
                if cursor.rowcount != 1:
                    raise self._fence_conflict(conflict, fence, [name])

    def _fence_conflict(
        self,
        conflict: type[CheckpointConflict],
        fence: Mapping[str, int | None],
        names: list[str],
    ) -> CheckpointConflict:
        """Which positions moved is unknown when several were written in one call."""
        where = ", ".join(
            f"{name!r} is no longer at "
            + ("no position" if fence.get(name) is None else str(fence.get(name)))
            for name in names
        )
        which = " (at least one of them)" if len(names) > 1 else ""
        return conflict(
            f"{self._dialect.describe()}: checkpoint {where}{which}: another writer stored it "
            "first; this send was rolled back"
        )

    def _create_checkpoint_table(self, db: DbConnection) -> None:
        if not self._dialect.table_exists(db, self._checkpoints.table):
            cursor = db.cursor()
            for statement in self._checkpoints.create:
                cursor.execute(statement)
        db.commit()
        self._checkpoint_table_ready = True

    def _load_checkpoint(self, prefix: str, db: DbConnection) -> dict[str, int]:
        try:
            if not self._dialect.table_exists(db, self._checkpoints.table):
                return {}
            cursor = db.cursor()
            cursor.execute(self._checkpoints.load)
            # Filtered here: LIKE is case-insensitive in SQLite and in most SQL Server collations.
            return {
                str(name): int(position)
                for name, position in cursor.fetchall()
                if str(name).startswith(prefix)
            }
        finally:
            db.rollback()


class SqlTransport:
    """The `Transport` of one SQL connection; the dialect modules subclass it per database."""

    def __init__(self, name: str, dialect: Dialect) -> None:
        self.name = name
        self.dialect = dialect
        self._admin: Connection | None = None
        self._opened: weakref.WeakSet[SqlSource | SqlSink] = weakref.WeakSet()

    def source(
        self,
        address: str,
        *,
        group: str | None = None,
        error_queue: str | None = None,
        checkpoint_store: CheckpointStore | None = None,
        seq_range: tuple[int, int] | None = None,
    ) -> SqlSource:
        """`group` and `checkpoint_store` mean nothing to a queue table and are ignored;
        `seq_range` restricts the source to a range of the table (see the module docstring)."""
        source = SqlSource(self.dialect, address, error_queue, seq_range=seq_range)
        self._opened.add(source)
        return source

    def sink(self, address: str, *, key: str | None = None) -> SqlSink:
        """`key` (a Kafka record key) means nothing to a queue table and is ignored."""
        sink = SqlSink(self.dialect, address)
        self._opened.add(sink)
        return sink

    def install_statements(self, addresses: Sequence[str]) -> list[str]:
        """The DDL `install` runs: each queue table, then the checkpoint table."""
        statements = [
            statement
            for address in dict.fromkeys(addresses)
            for statement in self.dialect.queue_statements(address).create
        ]
        return statements + list(self.dialect.checkpoint_statements().create)

    async def install(self, addresses: Sequence[str], *, print_only: bool = False) -> list[str]:
        """Create the queue tables (idempotent) and return the DDL run; with `print_only` run
        nothing and return that DDL as the database's own client would run it, as printed."""
        statements = self.install_statements(addresses)
        if print_only:
            return self.dialect.printable(statements)
        await self._run(partial(_execute_each, statements))
        return statements

    async def check(self, addresses: Sequence[str]) -> list[str]:
        """Reach the database; raise when a table is missing; return warnings."""
        return await self._run(partial(self._check, list(dict.fromkeys(addresses))))

    async def peek(self, address: str) -> QueueStats:
        return await self._run(partial(self._peek, address))

    def canonical_address(self, address: str) -> str:
        return self.dialect.canonical_address(address)

    async def bounds(self, address: str) -> tuple[int, int] | None:
        """The lowest and highest sequence number in the table; None when it is empty."""
        (row,) = await self._read(self.dialect.queue_statements(address).bounds, ())
        return None if row[0] is None else (int(row[0]), int(row[1]))

    async def count_range(self, address: str, lo: int, hi: int) -> int:
        """Rows with lo <= seq <= hi."""
        (row,) = await self._read(self.dialect.queue_statements(address).count_range, (lo, hi))
        return int(row[0] or 0)

    async def scan_range(self, address: str, after: int, hi: int, limit: int) -> list[ScannedRow]:
        """Up to `limit` rows with after < seq <= hi in seq order, read without locking them."""
        statement = self.dialect.queue_statements(address).scan_range
        return self.dialect.layout.scanned_rows(await self._read(statement, (after, hi, limit)))

    def purge_expired(self, address: str, batch_size: int = 1000) -> int:
        """Delete every expired row in batches of `batch_size`, blocking; returns how many."""
        purge = self.dialect.queue_statements(address).purge_expired
        total = 0
        try:
            db = self.dialect.connect()
            try:
                while True:
                    cursor = db.cursor()
                    cursor.execute(purge, (batch_size,))
                    deleted = max(cursor.rowcount, 0)
                    db.commit()
                    total += deleted
                    if deleted < batch_size:
                        return total
            finally:
                with contextlib.suppress(Exception):
                    db.close()
        except Exception as exc:
            error = self.dialect.translate(exc)
            if error is None:
                raise
            raise error from exc

    async def close(self) -> None:
        for opened in list(self._opened):
            await opened.close()
        if self._admin is not None:
            await self._admin.close()
            self._admin = None

    async def _run(self, work: Callable[[DbConnection], T]) -> T:
        if self._admin is None:
            self._admin = Connection(self.dialect)
        return await self._admin.run(work)

    async def _read(self, statement: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
        return await self._run(partial(self._fetch, statement, params))

    def _fetch(
        self, statement: str, params: Sequence[Any], db: DbConnection
    ) -> Sequence[Sequence[Any]]:
        try:
            cursor = db.cursor()
            cursor.execute(statement, params)
            return self.dialect.fetch(cursor)
        finally:
            db.rollback()

    def _check(self, addresses: list[str], db: DbConnection) -> list[str]:
        try:
            missing = [a for a in addresses if not self.dialect.table_exists(db, a)]
            if missing:
                names = ", ".join(self.dialect.table(a) for a in missing)
                raise TransportError(
                    f"{self.dialect.describe()}: queue table {names} does not exist "
                    "(run `bridge install`)"
                )
            return [warning for a in addresses for warning in self.dialect.warnings(db, a)]
        finally:
            db.rollback()

    def _peek(self, address: str, db: DbConnection) -> QueueStats:
        statements = self.dialect.queue_statements(address)
        try:
            depth = int(scalar(db, statements.depth) or 0)
            oldest = scalar(db, statements.oldest)
            expired = int(scalar(db, statements.expired) or 0)
        finally:
            db.rollback()
        age = _age_seconds(oldest, time.time())
        return QueueStats(depth=depth, oldest_age_seconds=age, expired=expired)


def _roll_back(db: DbConnection) -> None:
    db.rollback()


def _execute_each(statements: Sequence[str], db: DbConnection) -> None:
    cursor = db.cursor()
    for statement in statements:
        cursor.execute(statement)
        db.commit()


def _age_seconds(raw_headers: str | bytes | None, now: float) -> float | None:
    """Seconds since the row's `NServiceBus.TimeSent`; None when it has no readable one."""
    try:
        sent = headers_codec.decode(raw_headers).get(TIME_SENT)
        if sent is None:
            return None
        return max(0.0, now - timestamp_seconds(sent))
    except (HeadersFormatError, ValueError):
        return None
