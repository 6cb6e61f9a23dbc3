"""Chained batches: how a source with one writer (SQLite) receives ahead, in one transaction.

Where only one transaction can write, a source cannot receive ahead on a second connection: it
receives ahead in the transaction it holds, each batch after a savepoint, up to `CHAIN` batches
per transaction (none more once it has been open `CHAIN_SECONDS`). Settling a batch settles it
in that transaction; once every batch in it is settled, the transaction writes their error
copies and commits. Aborting a batch rolls back to its savepoint (the first: the whole
transaction), which returns its rows and those of any batch taken after it, and commits the
batches before it when none of them is left unsettled.

The runner settles batches in the order they were received, so a SQLite source reads the next
rows while the batch before them is sent, and commits once per transaction, not once per batch
(a SQLite commit of a batch costs about as much as its receive). A crash returns every batch of
the open transaction, settled ones too: up to `CHAIN` batches (at most `CHAIN_SECONDS` of them)
come back as duplicates, where a source that commits each batch returns one. A source that is
not behind takes one batch per transaction: the receive ahead finds nothing and the batch
commits as it settles.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from bridge.batch import Rejected
from bridge.envelope import PoisonMessage
from bridge.errors import SettleError, TransportError
from bridge.transports.sql.connection import Connection
from bridge.transports.sql.deadletter import ErrorQueue
from bridge.transports.sql.dialects.base import DbConnection, Dialect

__all__ = ["CHAIN", "CHAIN_SECONDS", "Chain", "Link", "in_new_transaction"]

#: At most this many batches, and no more once it has been open CHAIN_SECONDS, does a source
#: with one writer take in one transaction.
CHAIN = 16
CHAIN_SECONDS = 0.5

T = TypeVar("T")

#: Receives a batch in the open transaction (on the connection's thread); None: no rows.
Receive = Callable[[DbConnection], T | None]


def in_new_transaction(dialect: Dialect, receive: Receive[T], db: DbConnection) -> T | None:
    """Begin a transaction and receive in it; nothing received: rolled back, None."""
    dialect.begin(db)
    taken = receive(db)
    if taken is None:
        db.rollback()
    return taken


@dataclass(eq=False)
class _Transaction:
    """The open transaction and the batches taken in it, in order. Read and written only on
    the connection's thread."""

    resets: int  # the connection's `resets` when it began: another value, it was rolled back
    links: list[Link] = field(default_factory=list)

    def held(self) -> bool:
        return any(link.state == "held" for link in self.links)


@dataclass(eq=False)
class Link:
    """One batch of the open transaction: `held` until settled, `gone` once rolled back."""

    transaction: _Transaction
    index: int  # in `transaction.links`; a batch after the first has savepoint `_savepoint(index)`
    state: str = "held"
    # Settled with these to copy to the error queue: written right before the commit, since
    # written at once they would follow the savepoint of a later batch and go with it.
    poison: Sequence[PoisonMessage] = ()
    rejected: Sequence[Rejected] = ()


def _savepoint(index: int) -> str:
    return f"bridge_batch_{index}"


class Chain:
    """The chained transaction of one source's connection (see the module docstring).

    `held`, `receiving` and `ahead_allowed` are the event loop's view; everything else runs on
    the connection's thread.
    """

    def __init__(
        self, dialect: Dialect, address: str, connection: Connection, copies: ErrorQueue
    ) -> None:
        self._dialect = dialect
        self._address = address
        self._connection = connection
        self._copies = copies
        self._open: _Transaction | None = None  # on the connection's thread
        self.held = 0  # batches in the open transaction, as the last call on the thread said
        self.receiving = False  # a receive is under way
        self._began = 0.0  # time.monotonic() when its first batch was taken

    def ahead_allowed(self) -> bool:
        """Whether one more batch may be taken into the open transaction now."""
        return (
            0 < self.held < CHAIN
            and not self.receiving
            and time.monotonic() - self._began < CHAIN_SECONDS
        )

    async def take(self, receive: Receive[T], *, ahead: bool) -> tuple[T | None, Link | None]:
        """Take a batch: in a new transaction, or `ahead` in the open one after a savepoint."""
        before = self.held if ahead else 0
        try:
            taken, link, self.held = await self._connection.run(partial(self._take, receive, ahead))
            if not ahead and taken is not None:
                self._began = time.monotonic()
        except asyncio.CancelledError:
            # The thread may have taken a batch nobody will settle: return just that one.
            self._connection.later(partial(self._drop_taken_after, before))
            raise
        except BaseException:
            self.held = 0  # the failed call rolled the transaction back
            raise
        return taken, link

    async def commit(
        self, link: Link, poison: Sequence[PoisonMessage], rejected: Sequence[Rejected]
    ) -> None:
        await self._settle(partial(self._settle_link, link, poison, rejected))

    async def abort(self, link: Link) -> None:
        await self._settle(partial(self._abort_link, link))

    async def _settle(self, work: Callable[[DbConnection], int]) -> None:
        """Settle a batch of the open transaction; `work` says how many batches it then holds."""
        try:
            self.held = await self._connection.run(work)
        except BaseException:
            self.held = 0  # the failed call rolled the transaction back
            raise

    # -- on the connection's thread -------------------------------------------------------------

    def _current(self) -> _Transaction | None:
        current = self._open
        if current is not None and current.resets != self._connection.resets:
            current = self._open = None  # rolled back under it (a failed call, a cancel)
        return current

    def _take(
        self, receive: Receive[T], ahead: bool, db: DbConnection
    ) -> tuple[T | None, Link | None, int]:
        """(the batch taken or None, its link, how many batches the transaction then holds)."""
        current = self._current()
        if not ahead:
            if current is not None:
                raise SettleError("a new transaction was begun while one holds a batch")
            taken = in_new_transaction(self._dialect, receive, db)
            if taken is None:
                return None, None, 0
            current = self._open = _Transaction(self._connection.resets)
        else:
            if current is None or not current.held():  # settled and committed meanwhile
                return None, None, 0 if current is None else len(current.links)
            cursor = db.cursor()
            savepoint = _savepoint(len(current.links))
            cursor.execute(f"SAVEPOINT {savepoint}")
            taken = receive(db)
            if taken is None:
                cursor.execute(f"RELEASE {savepoint}")
                return None, None, len(current.links)
        link = Link(current, len(current.links))
        current.links.append(link)
        return taken, link, len(current.links)

    def _settle_link(
        self,
        link: Link,
        poison: Sequence[PoisonMessage],
        rejected: Sequence[Rejected],
        db: DbConnection,
    ) -> int:
        """Settle one batch in the open transaction; commit it when none is left held.
        Returns how many batches the open transaction then holds (0: committed)."""
        current = self._current()
        if current is not link.transaction or link.state != "held":
            raise TransportError(
                f"{self._dialect.describe()}: the transaction holding this batch of "
                f"{self._address!r} was rolled back; its rows are back in the table"
            )
        self._copies.refuse_without_error_queue(rejected)  # now: it fails this batch only
        link.state, link.poison, link.rejected = "settled", poison, rejected
        if current.held():
            return len(current.links)
        return self._commit(current, db)

    def _commit(self, current: _Transaction, db: DbConnection) -> int:
        """Every batch of the transaction is settled: write their error copies, commit."""
        for link in current.links:
            self._copies.write(link.poison, link.rejected, db)
        db.commit()
        self._open = None
        return 0

    def _abort_link(self, link: Link, db: DbConnection) -> int:
        current = self._current()
        if current is not link.transaction or link.state != "held":
            return 0 if current is None else len(current.links)  # its rows are back already
        return self._unlink(current, link.index, db)

    def _drop_taken_after(self, count: int, db: DbConnection) -> None:
        """Return the batch a cancelled receive took, if it took one: the `count`-th."""
        current = self._current()
        if current is not None and len(current.links) > count:
            self._unlink(current, count, db)

    def _unlink(self, current: _Transaction, index: int, db: DbConnection) -> int:
        """Roll back batch `index` and those after it; commit the ones before it when none of
        them is held. Returns how many batches the open transaction then holds."""
        for gone in current.links[index:]:
            gone.state = "gone"
        del current.links[index:]
        if index == 0:
            db.rollback()
            self._open = None
            return 0
        cursor = db.cursor()
        cursor.execute(f"ROLLBACK TO {_savepoint(index)}")
        cursor.execute(f"RELEASE {_savepoint(index)}")
        if current.held():
            return len(current.links)
        return self._commit(current, db)
