"""Sequence-range reads of bulk jobs: `bounds`, `count_range`, `scan_range`, `purge_expired`.

Bulk jobs (`bridge.migrate`: `bridge migrate`, `bridge report`) split a queue table by its FIFO
sequence (`seq`, SQL Server's `RowVersion`) into ranges worked on in parallel, each by a range
source (`Transport.source(..., seq_range=(lo, hi))`). These reads take nothing: they plan the
ranges, follow progress and read what a report shows. They are part of the SQL `Transport`'s
public API (mixed into it), on its administration connection.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

from bridge.errors import ConfigError
from bridge.transports.sql.dialects.base import DbConnection, Dialect
from bridge.transports.sql.errors import translated
from bridge.transports.sql.layouts.base import ScannedRow

__all__ = ["RangeReads", "ranged"]

T = TypeVar("T")


class RangeReads:
    """The range reads of the SQL `Transport` (see the module docstring)."""

    dialect: Dialect

    def _run(self, work: Callable[[DbConnection], T]) -> Awaitable[T]:
        """Run `work` on the transport's administration connection."""
        raise NotImplementedError

    async def bounds(self, address: str) -> tuple[int, int] | None:
        """The lowest and highest sequence number in the table; None when it is empty."""
        (row,) = await self._read(ranged(self.dialect, address, "bounds"), ())
        return None if row[0] is None else (int(row[0]), int(row[1]))

    async def count_range(self, address: str, lo: int, hi: int) -> int:
        """Rows with lo <= seq <= hi."""
        (row,) = await self._read(ranged(self.dialect, address, "count_range"), (lo, hi))
        return int(row[0] or 0)

    async def scan_range(self, address: str, after: int, hi: int, limit: int) -> list[ScannedRow]:
        """Up to `limit` rows with after < seq <= hi in seq order, read without locking them."""
        statement = ranged(self.dialect, address, "scan_range")
        return self.dialect.layout.scanned_rows(await self._read(statement, (after, hi, limit)))

    def purge_expired(self, address: str, batch_size: int = 1000) -> int:
        """Delete every expired row in batches of `batch_size`, blocking, on a connection of
        its own; returns how many."""
        purge = ranged(self.dialect, address, "purge_expired")
        total = 0
        with translated(self.dialect.describe(), self.dialect.classify):
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

    async def _read(self, statement: str, params: Sequence[Any]) -> Sequence[Sequence[Any]]:
        return await self._run(partial(_fetch, self.dialect, statement, params))


def ranged(dialect: Dialect, address: str, name: str) -> str:
    """Statement `name` of the sequence ranges of table `address`; ConfigError where its
    layout has none (NGinn's tables are not split into ranges)."""
    statement: str = getattr(dialect.queue_statements(address), name)
    if not statement:
        raise ConfigError(
            f"{dialect.describe()}: the {dialect.layout_name} layout has no sequence ranges "
            "(bulk moves and reports need the nservicebus layout)"
        )
    return statement


def _fetch(
    dialect: Dialect, statement: str, params: Sequence[Any], db: DbConnection
) -> Sequence[Sequence[Any]]:
    try:
        cursor = db.cursor()
        cursor.execute(statement, params)
        return dialect.fetch(cursor)
    finally:
        db.rollback()
