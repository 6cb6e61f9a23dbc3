"""The delayed-message movers of `bridge run`: one loop per SQL queue table of its routes.

A delay the bridge stores for a SQL queue table waits in that table's delayed table
(NServiceBus layout) or as an `R` row (NGinn), `bridge.transports.sql.delayed`. An NServiceBus
endpoint reading the table moves its own delayed rows, and NGinn its `R` rows; so that nothing
waits for an endpoint that is not running, `bridge run` moves them too, for every SQL
source and destination of its routes (explicit and derived): NServiceBus tables always, NGinn
tables where the connection has `nginn.retries` (else NGinn's own process owns its `R` rows).
A source's moved rows then go on as that source takes them (`bridge.transports.sql.forward`):
a row an NServiceBus endpoint delayed for the queue the bridge reads goes over the route when
due, once, and is never delayed again.

Each loop looks for due rows (a read: an idle table costs no write transaction), moves a batch
of them in one transaction (`MOVE_BATCH`, NServiceBus's default) when there are, again at once
(without looking first) while rows are due, and otherwise waits until the next row is due by
the database clock, at most `MAX_WAIT` seconds (a row stored meanwhile by another process may be due
sooner): so a delayed message arrives at most about that late. Movers of several processes and
NServiceBus's own compete safely: each statement takes the rows it moves (SQL Server: READPAST,
PostgreSQL: row locks, SQLite: one writer). A move that finds rows due but moves none (another
transaction holds them) waits `MIN_WAIT` seconds before it looks again, twice as long each time
that repeats, up to `MAX_WAIT`: it never polls in a loop. A failure is logged and the loop
tries again after a back-off of up to `MAX_BACKOFF` seconds. A table without a delayed table
(not installed by `bridge install`, or an endpoint's without delayed delivery) is said once and
looked for again every `MAX_BACKOFF` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from functools import partial

from bridge.config.models import BridgeConfig, Route
from bridge.errors import BridgeError
from bridge.protocols import Transport
from bridge.transports.sql.config import KINDS as SQL_KINDS
from bridge.transports.sql.connection import Connection
from bridge.transports.sql.delayed import MOVE_BATCH, move_due, move_if_due
from bridge.transports.sql.dialects.base import DbConnection
from bridge.transports.sql.transport import Transport as SqlTransport

__all__ = [
    "MAX_BACKOFF",
    "MAX_WAIT",
    "MIN_WAIT",
    "DelayedMover",
    "backoff",
    "movers",
    "next_wait",
]

log = logging.getLogger("bridge.movers")

#: The longest wait between two moves of one table, in seconds.
MAX_WAIT = 1.0
#: The first wait after a move that moved nothing although rows were due (another transaction
#: holds them: a competing mover's, an endpoint's), doubled while that lasts, up to `MAX_WAIT`.
MIN_WAIT = 0.05
#: The longest wait after a failed move, in seconds.
MAX_BACKOFF = 30.0


def next_wait(next_due: float | None, stalls: int) -> float:
    """Seconds until the next look at delayed rows: after `stalls` looks in a row that found
    rows due and moved none (another transaction holds them), `MIN_WAIT` doubled each time up
    to `MAX_WAIT`; else until the next is due (`next_due` seconds; None: none waits), at most
    `MAX_WAIT`."""
    if stalls:
        return min(MAX_WAIT, MIN_WAIT * 2.0 ** (stalls - 1))
    return MAX_WAIT if next_due is None else min(max(next_due, 0.0), MAX_WAIT)


def backoff(failures: int) -> float:
    """Seconds before trying again after `failures` failures in a row: 1 s doubled each time,
    at most `MAX_BACKOFF`."""
    return min(MAX_BACKOFF, 0.5 * 2.0**failures)


class DelayedMover:
    """Moves the due delayed messages of one queue table; see the module docstring."""

    def __init__(self, transport: SqlTransport, address: str, batch: int = MOVE_BATCH) -> None:
        self.transport = transport
        self.address = address
        self.batch = batch
        self.moves = 0  # looks and moves run (a test's look at the batching)

    async def run(self, stopping: asyncio.Event) -> None:
        dialect = self.transport.dialect
        statements = dialect.delayed_statements(self.address)
        connection = Connection(dialect, pool=self.transport.pool)
        failures = 0
        stalls = 0  # moves in a row that found rows due and moved none
        missing_said = False
        due_now = False  # rows were due after the last move: move again without a look
        try:
            while not stopping.is_set():
                try:
                    if statements.table and not await connection.run(self._table_exists):
                        if not missing_said:  # said once: an endpoint may create it later
                            log.warning(
                                "%s/%s has no delayed table %r: its delayed messages are not "
                                "moved until it exists (`bridge install` creates it)",
                                self.transport.name,
                                self.address,
                                statements.table,
                            )
                            missing_said = True
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stopping.wait(), timeout=MAX_BACKOFF)
                        continue
                    move = move_due if due_now else move_if_due
                    moved = await connection.run(
                        partial(move, dialect, statements, batch=self.batch)
                    )
                    next_due = moved.next_due
                    due_now = next_due is not None and next_due <= 0
                    self.moves += 1
                    failures = 0
                    stalls = stalls + 1 if moved.stalled else 0
                    if stalls:  # due rows someone else holds: look again after a while
                        due_now = False
                    wait = next_wait(next_due, stalls)
                except BridgeError as exc:
                    due_now = False
                    stalls = 0
                    failures += 1
                    wait = backoff(failures)
                    log.warning(
                        "moving delayed messages of %s/%s failed (again in %.0f s): %s",
                        self.transport.name,
                        self.address,
                        wait,
                        exc,
                    )
                if wait <= 0:
                    await asyncio.sleep(0)
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), timeout=wait)
        finally:
            await connection.close()

    def _table_exists(self, db: DbConnection) -> bool:
        dialect = self.transport.dialect
        try:
            return dialect.table_exists(db, dialect.delayed_statements(self.address).table)
        finally:
            db.rollback()


def movers(
    config: BridgeConfig, routes: Sequence[Route], transport: Callable[[str], Transport]
) -> list[DelayedMover]:
    """A mover for each SQL source and destination of `routes` whose delayed rows the bridge
    moves."""
    found: dict[tuple[str, str], DelayedMover] = {}
    ends = [(r.from_.connection, r.from_.address) for r in routes]
    # A publishing route's `to` names an event, not a queue (`bridge.config.pubsub`).
    ends += [(r.to.connection, r.to.address) for r in routes if not r.publish]
    for name, address in ends:
        connection = config.connections[name]
        if connection.type not in SQL_KINDS or (name, address) in found:
            continue
        nginn = getattr(connection, "nginn", None)
        if getattr(connection, "layout", "") == "nginn" and not (nginn and nginn.retries):
            continue
        sql = transport(name)
        assert isinstance(sql, SqlTransport)
        found[(name, address)] = DelayedMover(sql, address)
    return list(found.values())
