"""One route: receive a batch -> forward it -> settle it, in `concurrency` competing loops.

Guarantees
    The source is committed only after `Sink.send` returned, i.e. after the destination durably
    accepted the whole batch (`bridge.routing.forwarding`, its refusals:
    `bridge.routing.sending`); any failure before that aborts the batch, so its messages stay at
    (or return to) the source. Memory is bounded by `concurrency` batches (twice that for a
    source that `receives_ahead`) of at most `batch_size` messages and, after the first, about
    `batch_bytes` of bodies (see `bridge.routing.receiver`): a loop does not receive again
    before its batch is settled, or, receiving ahead, before the batch received ahead is sent,
    so a slow destination slows the source.

Pipeline
    A loop whose source `receives_ahead` (an SQL queue table: on PostgreSQL or SQL Server on a
    second connection, on SQLite in the transaction it holds) receives the next batch while it
    sends the current one; batches are still sent and settled one after the other, in the order
    they were received, so a loop keeps the source's order. When a batch fails, the one
    received ahead of it goes back to the source too.

State and failures
    Each loop's state, the route's derived from them, and the backoff after a failure:
    `bridge.routing.state`. A loop probes its source and destination when it starts and again
    after each backoff. With `stop_on_fatal` (the `--until-idle` mode) an error that will not
    go away by retrying stops the route instead of being retried slowly, so a drain does not
    spin forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from bridge.config.models import Route
from bridge.errors import BridgeError
from bridge.protocols import Readiness, Sink, Source
from bridge.routing.forwarding import BatchForwarder
from bridge.routing.receiver import Receiver
from bridge.routing.retry import Backoff
from bridge.routing.rules import RouteRules
from bridge.routing.state import PERMANENT_RETRY_MAX, RETRY_MAX, RouteState, RouteStats
from bridge.telemetry.metrics import Metrics, RouteMetrics
from bridge.telemetry.tracing import RouteTracing

__all__ = ["RouteRunner", "RouteStats"]

log = logging.getLogger("bridge.route")

#: Opens one loop's own source and sink (each loop has its own connections).
Endpoints = Callable[[], tuple[Source, Sink]]
#: Reaches the route's source and destination; raises as a send would when either is not there.
Probe = Callable[[], Awaitable[None]]


class RouteRunner:
    """Runs one route's loops until `stop()`; `stats` is what /routes shows."""

    def __init__(
        self,
        route: Route,
        endpoints: Endpoints,
        *,
        poll_timeout: float = 1.0,
        stop_on_fatal: bool = False,
        metrics: RouteMetrics | None = None,
        tracing: RouteTracing | None = None,
        probe: Probe | None = None,
        rules: RouteRules | None = None,
        keeps_failed: bool = False,
    ) -> None:
        self.route = route
        self._endpoints = endpoints
        self._poll_timeout = poll_timeout
        self._stop_on_fatal = stop_on_fatal
        self._probe = probe
        rules = rules or RouteRules(route)
        self._stopping = asyncio.Event()
        self._busy = 0
        self._not_ready: set[int] = set(range(route.concurrency))
        self._in_hand = [0] * route.concurrency  # messages each loop has received, not settled
        self._polled_at: float | None = None
        self._empty_at: list[float | None] = [None] * route.concurrency  # each loop's last look
        self.stats = RouteStats()
        self.started_at = time.monotonic()
        self.metrics = metrics or Metrics().for_route(
            route.name, f"{route.to.connection}/{route.to.address}"
        )
        self.tracing = tracing or RouteTracing(route)
        self.fatal: BaseException | None = None
        self._state = RouteState(route.name, route.concurrency, self.stats, self.metrics)
        self._forwarder = BatchForwarder(
            route,
            self.stats,
            self.metrics,
            self.tracing,
            rules,
            keeps_failed=keeps_failed,
        )

    @property
    def idle_for(self) -> float:
        """Seconds since any loop last received a message.

        0 while a loop is busy, in backoff, or has not yet looked at its source: a Kafka
        consumer still joining its group has not seen an empty topic.
        """
        if self._busy or self._polled_at is None or self.stats.state in ("backoff", "failing"):
            return 0.0
        return time.monotonic() - max(self.stats.last_activity, self._polled_at)

    @property
    def drained(self) -> bool:
        """Whether every loop has found the source empty since the route last forwarded.

        A loop's look counts only once it is ready (see `idle_for`); a loop in backoff, or
        one whose last receive brought messages, has not found it empty.
        """
        if self._busy or self.stats.state == "backoff":
            return False
        since = self.stats.last_activity
        return all(at is not None and at >= since for at in self._empty_at)

    @property
    def busy_seconds(self) -> float:
        """Seconds from the route's start to the end of its last batch (0: it had none)."""
        return max(0.0, self.stats.last_activity - self.started_at)

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        self.started_at = time.monotonic()
        loops = [
            asyncio.create_task(self._loop(i), name=f"{self.route.name}#{i}")
            for i in range(self.route.concurrency)
        ]
        try:
            await asyncio.gather(*loops)
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            self._state.set("stopped")

    async def _loop(self, index: int) -> None:
        source, sink = self._endpoints()
        backoff = Backoff(maximum=RETRY_MAX)
        slow = Backoff(initial=1.0, maximum=PERMANENT_RETRY_MAX)  # for what retrying cannot fix
        reached = self._probe is None
        route = self.route
        receiver = Receiver(source, route.batch_size, route.batch_bytes, self._poll_timeout)
        try:
            while not self._stopping.is_set():
                try:
                    if not reached and self._probe is not None:
                        await self._probe()
                        reached = True
                    empty = await self._forward_one_batch(index, receiver, sink)
                    self._mark_polled(index, source, empty)
                    backoff.reset()
                    slow.reset()
                except Exception as exc:  # an untranslated driver error must not kill the route
                    aborted, self._in_hand[index] = self._in_hand[index], 0
                    self._empty_at[index] = None
                    retriable = isinstance(exc, BridgeError) and exc.retriable
                    if not retriable and self._stop_on_fatal:
                        self.fatal = exc
                        self._state.set("failed")
                        self.stop()
                        return
                    reached = self._probe is None
                    delay = self._state.failed(
                        index, exc, backoff if retriable else slow, aborted, permanent=not retriable
                    )
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), timeout=delay)
        finally:
            await receiver.discard()
            await _close(source, sink)

    def _mark_polled(self, index: int, source: Source, empty: bool) -> None:
        """Track whether each loop's last receive really looked at an empty source.

        A source may say otherwise through `Readiness` (a Kafka consumer still joining its
        group, or holding only some partitions of a topic that is not drained).
        """
        if not isinstance(source, Readiness) or source.ready:
            self._not_ready.discard(index)
            if not self._not_ready and self._polled_at is None:
                self._polled_at = time.monotonic()
            self._empty_at[index] = time.monotonic() if empty else None
        else:
            self._not_ready.add(index)
            self._polled_at = None
            self._empty_at[index] = None

    async def _forward_one_batch(self, index: int, receiver: Receiver, sink: Sink) -> bool:
        """Receive a batch and forward it; whether it was empty."""
        batch = await receiver.take()
        empty = not (batch.messages or batch.poison or batch.expired)
        async with batch:
            if not empty:
                self._busy += 1
                count = self._in_hand[index] = len(batch.messages) + len(batch.poison)
                started = time.perf_counter()
                self.metrics.received(count)
                try:
                    await receiver.receive_ahead()  # where the source can: the next, while sending
                    await self._forwarder.forward(batch, sink)
                except BaseException:
                    await receiver.discard()  # returned first: this batch goes back before it
                    raise
                finally:
                    self.metrics.settled(count, started)
                    self._busy -= 1
                    self.stats.last_activity = time.monotonic()
                self._in_hand[index] = 0
            else:
                await batch.commit()
        if self._state.loops[index] != "running":
            self._state.set_loop(index, "running")
        return empty


async def _close(source: Source, sink: Sink) -> None:
    for closeable in (source, sink):
        try:
            await closeable.close()
        except Exception as exc:  # closing must not hide the reason the loop ended
            log.debug("close failed: %s", exc)
