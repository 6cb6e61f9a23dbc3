"""`Batch`: the one settle-once implementation of `ReceivedBatch` every transport hands out.

A transport passes two coroutine functions, `on_commit` and `on_abort`, which know its offsets,
delivery tags or open transaction; nothing of those leaks to the runner. Leaving the
`async with` block without `commit()` aborts; settling twice raises `SettleError` (kombu's
`MessageStateError`).

An `on_commit` that raises must leave every message of the batch at its source (roll back,
rewind, return the deliveries) before it raises. Such a batch is settled as "failed", not
"committed": a later `commit()` or `abort()` raises `SettleError` and leaving the block does not
abort it again (a second return could settle what the transport already handed back).

`reject(envelope, error)` marks a message the destination refused for good; the transport's
`on_commit` moves every rejected message to its error queue (inside the same transaction where
it has one) before it removes the batch from the source. It reads them from `rejected`, a list
it may share with the batch by passing it in.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType

from bridge.envelope import Envelope, PoisonMessage
from bridge.errors import SettleError
from bridge.protocols import Checkpoint

__all__ = ["Batch", "Rejected"]

Settle = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Rejected:
    envelope: Envelope
    error: BaseException


async def _nothing() -> None:
    return None


class Batch:
    def __init__(
        self,
        messages: Sequence[Envelope] = (),
        *,
        poison: Sequence[PoisonMessage] = (),
        expired: int = 0,
        checkpoint: Checkpoint | None = None,
        on_commit: Settle = _nothing,
        on_abort: Settle = _nothing,
        rejected: list[Rejected] | None = None,
    ) -> None:
        self.messages = messages
        self.poison = poison
        self.expired = expired
        self.checkpoint = checkpoint
        self._on_commit = on_commit
        self._on_abort = on_abort
        self.rejected: list[Rejected] = [] if rejected is None else rejected
        self.settled: str | None = None

    def __len__(self) -> int:
        return len(self.messages) + len(self.poison) + self.expired

    def _settle(self, verb: str, outcome: str) -> None:
        if self.settled is not None:
            raise SettleError(f"batch already {self.settled}; cannot {verb} it")
        self.settled = outcome

    def reject(self, envelope: Envelope, error: BaseException) -> None:
        """Send `envelope` to the error queue, not the destination, when the batch commits."""
        if self.settled is not None:
            raise SettleError(f"batch already {self.settled}; cannot reject from it")
        self.rejected.append(Rejected(envelope, error))

    async def commit(self) -> None:
        self._settle("commit", "committed")
        try:
            await self._on_commit()
        except BaseException:
            self.settled = "failed"
            raise

    async def abort(self) -> None:
        self._settle("abort", "aborted")
        await self._on_abort()

    async def __aenter__(self) -> Batch:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.settled is None:
            await self.abort()
