"""An in-process transport that keeps the full contract: used by tests and as a reference.

Features
    FIFO queues per address shared by every `Transport` object in the process (`Broker`);
    receive takes messages out and holds them until the batch settles (abort puts them back
    at the front, in order); checkpoints are stored atomically with the messages they came with.

What is lossy
    Everything, on process exit. It is not durable and is never a production destination.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from bridge.batch import Batch, Rejected
from bridge.envelope import Envelope, PoisonMessage
from bridge.errors import HeadersFormatError
from bridge.nservicebus.deadletter import DEFAULT_ERROR_QUEUE, error_copy
from bridge.protocols import Checkpoint, CheckpointStore, QueueStats

__all__ = ["Broker", "Transport"]


@dataclass
class Broker:
    """The process-wide store: queues and checkpoints, guarded by one condition."""

    queues: dict[str, deque[Envelope | PoisonMessage]] = field(default_factory=dict)
    checkpoints: dict[str, int] = field(default_factory=dict)
    changed: asyncio.Condition | None = None

    def queue(self, address: str) -> deque[Envelope | PoisonMessage]:
        return self.queues.setdefault(address, deque())

    def condition(self) -> asyncio.Condition:
        if self.changed is None:
            self.changed = asyncio.Condition()
        return self.changed


BROKER = Broker()


def _copy(envelope: Envelope) -> Envelope:
    return Envelope(
        envelope.headers.copy(),
        envelope.body,
        envelope.expires_at,
        deliver_at=envelope.deliver_at,
    )


class MemorySource:
    def __init__(
        self, broker: Broker, address: str, error_queue: str | None, receives_ahead: bool = False
    ) -> None:
        self._broker = broker
        self._address = address
        self._error_queue = error_queue or DEFAULT_ERROR_QUEUE
        #: May hold more than one batch (aborting the later first keeps the queue's order).
        self.receives_ahead = receives_ahead
        self._held: list[Batch] = []

    async def receive_batch(self, max_messages: int, timeout: float) -> Batch:
        queue = self._broker.queue(self._address)
        changed = self._broker.condition()
        async with changed:
            if not queue:
                try:
                    await asyncio.wait_for(changed.wait_for(lambda: bool(queue)), timeout)
                except TimeoutError:
                    return Batch()
            taken = [queue.popleft() for _ in range(min(max_messages, len(queue)))]
        rejected: list[Rejected] = []
        poison = [item for item in taken if isinstance(item, PoisonMessage)]

        async def commit() -> None:
            self._held.remove(batch)
            dead = self._broker.queue(self._error_queue)
            dead.extend(error_copy(item, item.reason, self._address) for item in poison)
            dead.extend(error_copy(r.envelope, r.error, self._address) for r in rejected)
            async with changed:
                changed.notify_all()

        async def abort() -> None:
            self._held.remove(batch)
            queue.extendleft(reversed(taken))
            async with changed:
                changed.notify_all()

        batch = Batch(
            [item for item in taken if isinstance(item, Envelope)],
            poison=poison,
            on_commit=commit,
            on_abort=abort,
            rejected=rejected,
        )
        self._held.append(batch)
        return batch

    async def close(self) -> None:
        """Hand back every batch still in hand, the latest first (the queue keeps its order)."""
        for batch in reversed(list(self._held)):
            await batch.abort()


class MemorySink:
    def __init__(self, broker: Broker, address: str) -> None:
        self._broker = broker
        self._address = address

    async def send(
        self, envelopes: Sequence[Envelope], checkpoint: Checkpoint | None = None
    ) -> None:
        self._broker.queue(self._address).extend(_copy(e) for e in envelopes)
        if checkpoint:
            self._broker.checkpoints.update(checkpoint)
        changed = self._broker.condition()
        async with changed:
            changed.notify_all()

    async def load_checkpoint(self, prefix: str) -> dict[str, int]:
        return {k: v for k, v in self._broker.checkpoints.items() if k.startswith(prefix)}

    async def close(self) -> None:
        return None


class Transport:
    def __init__(
        self,
        name: str = "memory",
        config: object = None,
        broker: Broker = BROKER,
        *,
        receives_ahead: bool = False,
    ):
        self.name = name
        self.broker = broker
        self.receives_ahead = receives_ahead

    def source(
        self,
        address: str,
        *,
        group: str | None = None,
        error_queue: str | None = None,
        checkpoint_store: CheckpointStore | None = None,
    ) -> MemorySource:
        return MemorySource(self.broker, address, error_queue, self.receives_ahead)

    def sink(self, address: str, *, key: str | None = None) -> MemorySink:
        return MemorySink(self.broker, address)

    def put_poison(self, address: str, raw_headers: str, body: bytes) -> None:
        """Queue a message whose headers cannot be read, as a broken producer would."""
        self.broker.queue(address).append(
            PoisonMessage(raw_headers, body, "unreadable headers", HeadersFormatError.__name__)
        )

    async def install(self, addresses: Sequence[str], *, print_only: bool = False) -> list[str]:
        unique = list(dict.fromkeys(addresses))
        if not print_only:
            for address in unique:
                self.broker.queue(address)
        return [f"memory queue {a}" for a in unique]

    async def check(self, addresses: Sequence[str]) -> list[str]:
        return []

    async def peek(self, address: str) -> QueueStats:
        return QueueStats(depth=len(self.broker.queue(address)))

    def canonical_address(self, address: str) -> str:
        return address

    async def close(self) -> None:
        return None
