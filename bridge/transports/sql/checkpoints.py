"""Source positions stored with the rows: `BridgeCheckpoints`, fenced (Kafka -> SQL exactly-once).

A send with a checkpoint upserts the source's positions (name -> int) into the
`BridgeCheckpoints (name, position)` table next to the queue tables, in the send's transaction:
the rows and the positions they came from commit together. The table is this project's own,
the same under every layout, and is created by the first send that needs it.

Fences. A sink told `fence_checkpoint` writes a position only over the one it expects (at
first the stored one, then the one it committed last), so that of two writers of one position
(two attempts of one bulk task) only one commits; the other's send rolls back with
`CheckpointConflict`. A `FencedCheckpoint` (a Kafka source's batch) is written the same way
over the positions its batch started from; a conflict there is `PositionMoved`, retriable: the
source receives again from the stored positions.

Commits whose answer is lost. When the connection drops after a send's COMMIT went out, the
positions it wrote may be stored or not. The sink keeps them (`unsure`) until a later send of
those positions commits: a writer whose fenced write then conflicts can read the stored
positions back and tell its own lost commit (they are the unsure ones) from another writer's.
"""

from __future__ import annotations

from collections.abc import Mapping

from bridge.errors import TransportError
from bridge.transports.sql.dialects.base import DbConnection, DbCursor, Dialect

__all__ = ["CheckpointConflict", "Checkpoints", "PositionMoved"]


class CheckpointConflict(TransportError):
    """A fenced checkpoint write found another writer's position: the send was rolled back."""


class PositionMoved(CheckpointConflict):
    """A `FencedCheckpoint`'s batch is stale: another consumer of its partitions stored a
    position first. Retriable: the source receives again from the stored positions."""

    retriable = True


class Checkpoints:
    """The checkpoint writes of one sink; the statement methods run on its connection's thread."""

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self._statements = dialect.checkpoint_statements()
        self._table_ready = False
        self._fence: dict[str, int | None] | None = None
        #: Positions written by sends whose COMMIT failed: stored or not, unknown.
        self.unsure: dict[str, int] = {}

    def fence(self, stored: Mapping[str, int | None]) -> None:
        """Write each position only over the one expected from now on (see the module)."""
        self._fence = dict(stored)

    def ensure_table(self, db: DbConnection) -> None:
        """Create the table, once per sink, outside the send's transaction."""
        if self._table_ready:
            return
        if not self._dialect.table_exists(db, self._statements.table):
            cursor = db.cursor()
            for statement in self._statements.create:
                cursor.execute(statement)
        db.commit()
        self._table_ready = True

    def write(
        self,
        cursor: DbCursor,
        positions: list[tuple[str, int]],
        expected: Mapping[str, int | None] | None,
    ) -> None:
        """Write `positions` in the open transaction: fenced by `expected` (a
        `FencedCheckpoint`'s), else by this sink's fence, else upserted."""
        if expected is not None:
            self._write_fenced(cursor, expected, positions, PositionMoved)
        elif self._fence is not None:
            self._write_fenced(cursor, self._fence, positions, CheckpointConflict)
        else:
            cursor.executemany(self._statements.upsert, positions)

    def commit_failed(self, positions: list[tuple[str, int]]) -> None:
        """The COMMIT of the send that wrote `positions` raised: they may be stored or not."""
        self.unsure.update(positions)

    def committed(
        self, positions: list[tuple[str, int]], expected: Mapping[str, int | None] | None
    ) -> None:
        """The send that wrote `positions` committed: they are what the fence expects next."""
        for name, _ in positions:
            self.unsure.pop(name, None)
        if expected is None and self._fence is not None:
            self._fence.update(positions)

    def load(self, prefix: str, db: DbConnection) -> dict[str, int]:
        """Stored positions whose names start with `prefix`."""
        try:
            if not self._dialect.table_exists(db, self._statements.table):
                return {}
            cursor = db.cursor()
            cursor.execute(self._statements.load)
            # Filtered here: LIKE is case-insensitive in SQLite and in most SQL Server collations.
            return {
                str(name): int(position)
                for name, position in cursor.fetchall()
                if str(name).startswith(prefix)
            }
        finally:
            db.rollback()

    def _write_fenced(
        self,
        cursor: DbCursor,
        fence: Mapping[str, int | None],
        positions: list[tuple[str, int]],
        conflict: type[CheckpointConflict],
    ) -> None:
        new = [(name, position) for name, position in positions if fence.get(name) is None]
        moved = [(p, name, fence[name]) for name, p in positions if fence.get(name) is not None]
        for statement, rows, names in (
            (self._statements.insert_new, new, [name for name, _ in new]),
            (self._statements.advance, moved, [name for _, name, _ in moved]),
        ):
            if not rows:
                continue
            if self._dialect.summed_rowcount:  # one call per kind, not a round trip per position
                cursor.executemany(statement, rows)
                if cursor.rowcount != len(rows):
                    raise self._conflict(conflict, fence, names)
                continue
            for row, name in zip(rows, names, strict=True):
                cursor.execute(statement, row)
                if cursor.rowcount != 1:
                    raise self._conflict(conflict, fence, [name])

    def _conflict(
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
