"""`SqlSink`: inserts envelopes as an NServiceBus endpoint would, one transaction per `send`.

Guarantees
    A send inserts the whole list in one transaction and returns only after COMMIT; with a
    checkpoint, the source positions are written in that same transaction
    (`bridge.transports.sql.checkpoints`). A message whose headers no row can hold (a lone
    surrogate) raises `MessageRejected` with its index before anything is written, so the
    runner sends it to the error queue and the rest on. A row the database refuses for good
    (a data exception, see `errors.py`) fails the whole send with `MessageRejected` without an
    index, so the runner sends each message alone.

Delays
    A message with `deliver_at` still to come is stored as a delayed message in the same
    transaction: a row of the table's delayed table (NServiceBus layout) or an `R` row (NGinn),
    `bridge.transports.sql.delayed`. One due more than `MAX_DELAY_SECONDS` (2^31-1 s) on, or
    with a time to be received, raises `MessageRejected` with its index before anything is
    written, and so does the first delayed message of a send when the delayed table does not
    exist (NServiceBus layout; looked for before the first delayed message is stored, until
    found): the runner sends it to the error queue, the reason saying who creates the table,
    and the rest of the batch on, instead of the insert failing the whole batch again and again.

Staged sends
    A send of `STAGE_FROM` rows or more goes through the dialect's send stage where it has one
    (PostgreSQL: a binary COPY into a temporary table, then one INSERT ... SELECT in order),
    which lays the rows out in the driver's C code instead of running Python per row; fewer
    rows take one pipelined `executemany`, which costs fewer round trips. Each staged send
    creates the stage in its transaction unless the session has it (a rollback drops one it
    created; a pooler may hand the next transaction another session).

Connections
    A sink's connection comes from its transport's pool where it has one (PostgreSQL, SQL
    Server: `bridge.transports.sql.pool`), leased for each send's transaction.

In a source's transaction
    A sink on a `borrowed` connection (`SqlSource.sink_in_transaction`) writes into the
    transaction its source has open and leaves the commit to that source's batch. A refused
    row there is a plain `TransportError`: the failed insert rolled back the source's
    transaction with it, so the batch can only be aborted, not sent again in parts.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from bridge.envelope import Envelope
from bridge.errors import HeadersFormatError, MessageRejected, TransportError
from bridge.nservicebus.delays import DELAY_WITH_TTL, too_long
from bridge.protocols import Checkpoint, FencedCheckpoint
from bridge.transports.sql.checkpoints import Checkpoints
from bridge.transports.sql.config import MAX_DELAY_SECONDS
from bridge.transports.sql.connection import Connection
from bridge.transports.sql.delayed import MISSING_DELAYED_TABLE, store_params
from bridge.transports.sql.dialects.base import DbConnection, Dialect
from bridge.transports.sql.layouts.base import new_ids
from bridge.transports.sql.pool import Pool

__all__ = ["STAGE_FROM", "SqlSink"]

#: A send of at least this many rows is staged where the dialect can (`Dialect.stage_rows`).
STAGE_FROM = 64


class SqlSink:
    """Inserts envelopes into one queue table; see the module docstring."""

    def __init__(
        self,
        dialect: Dialect,
        address: str,
        borrowed: Connection | None = None,
        pool: Pool | None = None,
    ) -> None:
        self._dialect = dialect
        self._address = address
        dialect.queue_statements(address)  # an impossible name fails now
        self._checkpoints = Checkpoints(dialect)
        self._borrowed = borrowed is not None
        self._connection = borrowed or Connection(dialect, pool=pool)
        # Where the dialect stages sends (see `STAGE_FROM`): the insert from the stage.
        staged = dialect.queue_statements(address).send_staged if dialect.send_stage else ""
        self._staged = "" if self._borrowed else staged
        #: The delayed table was found (looked for once, before the first delayed message).
        self._delayed_found = False

    def fence_checkpoint(self, stored: Mapping[str, int | None]) -> None:
        """From now on, store a position only over the one expected: at first `stored[name]`
        (None or absent: no row yet), then the one this sink committed last. When another
        writer got there first, the send rolls back and raises `CheckpointConflict`."""
        if self._borrowed:
            raise ValueError("a sink in its source's transaction cannot fence its checkpoint")
        self._checkpoints.fence(stored)

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

    def unsure_checkpoint(self) -> dict[str, int]:
        """Positions written by sends whose COMMIT failed (the connection dropped before its
        answer), not written again since: stored or not, `load_checkpoint` tells."""
        return dict(self._checkpoints.unsure)

    async def load_checkpoint(self, prefix: str) -> dict[str, int]:
        """Stored positions whose names start with `prefix` (empty before the first one)."""
        return await self._connection.run(partial(self._checkpoints.load, prefix))

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
        address = self._address
        rows: list[Sequence[Any]] = []
        delayed: list[Sequence[Any]] = []
        first_delayed = 0  # the index of the first of `delayed`: refused if its table is missing
        for index, (envelope, native_id) in enumerate(
            zip(envelopes, new_ids(len(envelopes)), strict=True)
        ):
            try:
                due = envelope.deliver_at
                if due is not None and due > now:
                    where = f"{self._dialect.describe()}: table {self._address!r}"
                    if envelope.expires_at is not None:
                        return MessageRejected(f"{where}: {DELAY_WITH_TTL}", index=index)
                    assert MAX_DELAY_SECONDS is not None
                    longer = too_long(envelope, now, MAX_DELAY_SECONDS, where, index)
                    if longer is not None:
                        return longer
                    due_ms = round((due - now) * 1000)
                    if not delayed:
                        first_delayed = index
                    delayed.append(store_params(self._dialect, envelope, due_ms, address, now))
                    continue
                rows.append(send_params(outgoing(envelope, now, native_id, address=address)))
            except HeadersFormatError as exc:
                where = f"{self._dialect.describe()}: table {self._address!r}"
                return MessageRejected(f"{where}: {exc}", index=index)
        if delayed and not self._delayed_found:
            missing = self._missing_delayed_table(db, first_delayed)
            if missing is not None:
                return missing
        if positions:
            self._checkpoints.ensure_table(db)
        staged = self._staged and len(rows) >= STAGE_FROM
        if not self._borrowed:
            self._dialect.begin(db)
        cursor = db.cursor()
        if staged:
            self._dialect.stage_rows(db, rows)
            cursor.execute(self._staged)
        elif rows:
            cursor.executemany(self._dialect.send_statement(db, self._address), rows)
        if delayed:
            cursor.executemany(self._dialect.delayed_statements(self._address).store, delayed)
        if positions:
            self._checkpoints.write(cursor, positions, expected)
        if not self._borrowed:
            try:
                db.commit()
            except BaseException:
                if positions:  # the server may have committed: see `unsure_checkpoint`
                    self._checkpoints.commit_failed(positions)
                raise
        if positions:
            self._checkpoints.committed(positions, expected)
        return None

    def _missing_delayed_table(self, db: DbConnection, index: int) -> MessageRejected | None:
        """The refusal of the delayed message at `index` when the destination's delayed table
        does not exist (NGinn: none is needed, its `R` rows wait in the queue table)."""
        table = self._dialect.delayed_statements(self._address).table
        if not table or self._dialect.table_exists(db, table):
            self._delayed_found = True
            return None
        if not self._borrowed:
            db.rollback()
        return MessageRejected(
            f"{self._dialect.describe()}: table {self._address!r}: its delayed table "
            f"{self._dialect.table(table)}, where a delayed message waits, does not exist "
            f"({MISSING_DELAYED_TABLE})",
            index=index,
        )
