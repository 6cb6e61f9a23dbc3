"""One loop's receives: how many messages to ask for, and the batch received ahead.

Sizing
    A receive asks for `batch_size` messages, cut so that a batch holds about `batch_bytes` of
    bodies at the average body size of the last batch that had messages (never below 1). Until
    a batch has shown the sizes it asks for at most `FIRST_BATCH`, so a queue of large messages
    costs a first batch no more than `FIRST_BATCH` of them.

Receiving ahead
    From a source that `ReceivesAhead`, the next batch is received while the loop sends the
    current one. The loop still sends and settles batches one at a time, in the order they
    were received, and a batch received ahead of a failed one goes back to the source
    (`discard`).

"""

from __future__ import annotations

import asyncio
import logging

from bridge.protocols import ReceivedBatch, ReceivesAhead, Source

__all__ = ["Receiver"]

log = logging.getLogger("bridge.route")


class Receiver:
    """Receives for one loop of a route from `source` (see the module docstring)."""

    FIRST_BATCH = 100

    def __init__(self, source: Source, max_messages: int, max_bytes: int, timeout: float) -> None:
        self._source = source
        self._ahead = source if isinstance(source, ReceivesAhead) else None
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._count = min(max_messages, self.FIRST_BATCH)
        self._timeout = timeout
        self._task: asyncio.Task[ReceivedBatch] | None = None

    def _sized(self, batch: ReceivedBatch) -> ReceivedBatch:
        messages = batch.messages
        if messages:
            average = max(1, sum(len(m.body) for m in messages) // len(messages))
            self._count = max(1, min(self._max_messages, self._max_bytes // average))
        return batch

    async def receive_ahead(self) -> None:
        """Start receiving the next batch, where the source can hold one more now."""
        # Asked each time: a SQLite source receives ahead only while its transaction has room.
        if self._ahead is None or not self._ahead.receives_ahead:
            return
        self._task = asyncio.create_task(self._source.receive_batch(self._count, self._timeout))
        # Let the receive reach its database thread now: the send that follows lays out its
        # records without yielding, and the receive would otherwise start only when the send
        # first waits.
        await asyncio.sleep(0)

    async def take(self) -> ReceivedBatch:
        """The batch received ahead, else a new receive."""
        task, self._task = self._task, None
        if task is None:
            return self._sized(await self._source.receive_batch(self._count, self._timeout))
        return self._sized(await task)

    async def discard(self) -> None:
        """Stop the receive ahead, or return the batch it took."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.wait([task])
        if task.cancelled() or task.exception() is not None:
            return  # nothing taken (a cancelled receive rolls its own transaction back)
        try:
            await task.result().abort()
        except Exception as exc:  # the source returns what it held when its connection goes
            log.debug("returning a batch received ahead failed: %s", exc)
