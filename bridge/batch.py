"""`Batch`: the one settle-once implementation of `ReceivedBatch` every transport hands out.

A transport passes two coroutine functions, `on_commit` and `on_abort`, which know its offsets,
delivery tags or open transaction; nothing of those leaks to the runner. Leaving the
`async with` block without `commit()` aborts; settling twice raises `SettleError` (kombu's
`MessageStateError`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType

from bridge.envelope import Envelope, PoisonMessage
from bridge.errors import SettleError
from bridge.protocols import Checkpoint

__all__ = ["Batch"]

Settle = Callable[[], Awaitable[None]]


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
    ) -> None:
        self.messages = messages
        self.poison = poison
        self.expired = expired
        self.checkpoint = checkpoint
        self._on_commit = on_commit
        self._on_abort = on_abort
        self.settled: str | None = None

    def __len__(self) -> int:
        return len(self.messages) + len(self.poison) + self.expired

    def _settle(self, verb: str, outcome: str) -> None:
        if self.settled is not None:
            raise SettleError(f"batch already {self.settled}; cannot {verb} it")
        self.settled = outcome

    async def commit(self) -> None:
        self._settle("commit", "committed")
        await self._on_commit()

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
