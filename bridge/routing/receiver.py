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

Waiting for the receive to begin (speed-up seam `receive_announce`)
    Where the source announces when its thread is about to run the receive's statement
    (`AnnouncesReceive`), the loop waits for that before it lays out the send: a thread that
    needs the interpreter lock on its way there while the send holds it waits up to the switch
    interval (5 ms), each time. Plain: the loop only yields once. `bench/speedups.py
    receive_announce` measures it; tests/unit/test_runner.py checks both move the same messages.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from bridge import speedups
from bridge.protocols import AnnouncesReceive, ReceivedBatch, ReceivesAhead, Source

__all__ = ["Receiver"]

log = logging.getLogger("bridge.route")

#: Whether a loop waits for an announcing source's receive to begin (see the module docstring).
WAIT_FOR_BEGUN = speedups.enabled("receive_announce")


class Receiver:
    """Receives for one loop of a route from `source` (see the module docstring)."""

    FIRST_BATCH = 100

    def __init__(self, source: Source, max_messages: int, max_bytes: int, timeout: float) -> None:
        self._source = source
        self._ahead = source if isinstance(source, ReceivesAhead) else None
        self._announces = (
            source if WAIT_FOR_BEGUN and isinstance(source, AnnouncesReceive) else None
        )
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
        task = self._task = asyncio.create_task(
            self._source.receive_batch(self._count, self._timeout)
        )
        # Let the receive reach its database thread now: the send that follows lays out its
        # records without yielding, and the receive would otherwise start only when the send
        # first waits. Where the source announces its receive, wait for that too (see above).
        await asyncio.sleep(0)
        begun = None if self._announces is None else self._announces.receive_begun
        if begun is not None and not begun.done() and not task.done():
            either: list[asyncio.Future[Any]] = [begun, task]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)

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
