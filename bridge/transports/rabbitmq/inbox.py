"""Deliveries handed over from pika's ioloop thread to the event loop, where a receive waits.

The ioloop thread wakes the event loop only when a receive waits and enough deliveries for it
are there: not once per delivery, and not at all between receives; and when the connection is
lost (`lose`), so that a waiting receive ends at once rather than at its timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass

import pika

from bridge.errors import BridgeError

__all__ = ["Delivery", "Inbox"]

_NOBODY_WAITS = 1 << 62


@dataclass(slots=True)
class Delivery:
    """One message as pika delivered it, with the consumer and channel (`epoch`) it came on."""

    consumer: int
    epoch: int
    tag: int
    properties: pika.BasicProperties
    body: bytes
    arrived: float = 0.0  # time.monotonic() when the ioloop thread put it in the inbox


class Inbox:
    """The deliveries of one source: put on the ioloop thread, waited for on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[Delivery] = deque()
        self._arrived = asyncio.Event()
        self._lock = threading.Lock()
        self._wake_pending = False
        self._wanted = _NOBODY_WAITS  # deliveries the waiting receive needs before it wakes
        self.cancelled: set[str] = set()  # consumer tags the broker cancelled
        self.lost: BridgeError | None = None  # set by `lose`, taken by the source

    def lose(self, error: BridgeError) -> None:
        """On the ioloop thread: the connection the deliveries came on is gone; wake a waiting
        receive (`wait_for` returns False while `lost` is set)."""
        self.lost = error
        with contextlib.suppress(RuntimeError):  # the event loop is closed
            self._loop.call_soon_threadsafe(self._arrived.set)

    def put(self, delivery: Delivery) -> None:
        """On the ioloop thread: queue one delivery; wake the event loop when a receive waits
        for as many as there are now (those of an earlier consumer count too: it recounts)."""
        items = self._items
        delivery.arrived = time.monotonic()  # before it can be seen in `items`
        items.append(delivery)
        if len(items) < self._wanted:
            return
        with self._lock:
            if self._wake_pending:
                return
            self._wake_pending = True
        with contextlib.suppress(RuntimeError):  # the event loop is closed
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._arrived.set()  # `_wake_pending` stays: one wake per wait is enough

    def count(self, consumer: int) -> int:
        """Deliveries of `consumer` waiting; those of an earlier consumer are dropped."""
        while self._items and self._items[0].consumer != consumer:
            self._items.popleft()  # requeued by an abort or by the loss of its channel
        return len(self._items)

    async def wait_for(self, consumer: int, wanted: int, timeout: float) -> bool:
        """Wait until `wanted` deliveries wait; False when `timeout` passes first or the
        connection is lost."""
        deadline = self._loop.time() + timeout
        while self.count(consumer) < wanted:
            if self.lost is not None:
                return False
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                return False
            with self._lock:
                self._wake_pending = False
            self._wanted = wanted
            try:
                # A delivery put before `_wanted` was set woke nobody: count again.
                if self.count(consumer) >= wanted:
                    break
                self._arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), remaining)
            finally:
                self._wanted = _NOBODY_WAITS
        return True

    def first_arrived(self, consumer: int) -> float:
        """When the oldest delivery of `consumer` waiting arrived (there is one)."""
        self.count(consumer)
        return self._items[0].arrived

    def last_arrived(self) -> float:
        """When the newest delivery waiting arrived (there is one)."""
        return self._items[-1].arrived

    def take(self, consumer: int, limit: int) -> list[Delivery]:
        self.count(consumer)
        return [self._items.popleft() for _ in range(min(limit, len(self._items)))]
