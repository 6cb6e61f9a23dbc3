"""One route: receive a batch -> drop expired -> header rules -> send -> commit, in
`concurrency` competing loops.

Guarantees
    The source is committed only after `Sink.send` returned, i.e. after the destination durably
    accepted the whole batch; any failure before that aborts the batch, so its messages stay at
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

State
    Each loop has its own state and the route's is derived from them: `failing` when any loop
    is failing (below), else `backoff` when any loop is in backoff, `running` only when every
    loop is, else `starting`. A loop is running once
    its `probe` (reaching the source and the destination) has passed and a receive returned:
    a sink that connects at its first send, behind an empty source, cannot make an unreachable
    destination look ready. The probe runs when the loop starts and again after each backoff,
    not per batch.

Failures
    A retriable error (`retriable = True` on the `BridgeError` class) puts the loop into backoff
    (capped exponential, jittered: 0.1 s doubling to `RETRY_MAX`, 20 s) and it retries on its
    own, so a route runs again within about 20 s of its service's return. Any other
    error (a refused login, `AccessRefused`; a missing table or queue; an untranslated driver
    error) will not go away by retrying, but someone may fix it while the service runs (a
    password changed back, a grant, `bridge install`): the loop is `failing`, logs the error at
    ERROR saying so, and tries again slowly (1 s doubling to `PERMANENT_RETRY_MAX`, 5 minutes),
    so a refused login is not repeated often enough to lock an account or flood the server's
    log. With `stop_on_fatal` (the `--until-idle` mode) such an error stops the route instead,
    so a drain does not spin forever.

Logs
    State changes (INFO), each failure with its retry (WARNING) and each batch that sent
    messages to the error queue (one WARNING per batch: how many, where, the first reason);
    never a line per message. They carry `route` (and `state`) as structured fields.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from bridge.config.models import DerivedRoute, Route
from bridge.envelope import Envelope
from bridge.errors import BridgeError, MessageRejected, MessagesRejected
from bridge.nservicebus.events import is_control, is_published, published, topics_of
from bridge.protocols import Readiness, ReceivedBatch, Sink, Source
from bridge.routing.receiver import Receiver
from bridge.routing.retry import Backoff
from bridge.routing.rules import RouteRules
from bridge.telemetry.metrics import Metrics, RouteMetrics
from bridge.telemetry.tracing import RouteTracing

__all__ = ["RouteRunner", "RouteStats"]

log = logging.getLogger("bridge.route")

#: The longest wait between two attempts of a loop whose error may go away (a service down, a
#: network gone): the most a route can lag behind its service's return, within the fault
#: suite's 30 s (tests/integration/test_network_faults.py).
RETRY_MAX = 20.0
#: The longest wait between two attempts of a loop whose error will not go away by retrying.
PERMANENT_RETRY_MAX = 300.0

#: Opens one loop's own source and sink (each loop has its own connections).
Endpoints = Callable[[], tuple[Source, Sink]]
#: Reaches the route's source and destination; raises as a send would when either is not there.
Probe = Callable[[], Awaitable[None]]


@dataclass
class RouteStats:
    forwarded: int = 0
    expired: int = 0
    poison: int = 0
    retried: int = 0
    retried_messages: int = 0
    batches: int = 0
    #: Subscribe/Unsubscribe control messages a proxy's route dropped (`nservicebus/events.py`).
    control_dropped: int = 0
    #: Published events forwarded, by event type (the most derived one they carry).
    published: dict[str, int] = field(default_factory=dict)
    state: str = "starting"
    last_error: str | None = None
    last_error_at: float | None = None
    last_activity: float = field(default_factory=time.monotonic)


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
        #: The source keeps what it cannot forward in its own table (no error queue named).
        self._keeps_failed = keeps_failed
        self._endpoints = endpoints
        self._poll_timeout = poll_timeout
        self._stop_on_fatal = stop_on_fatal
        self._probe = probe
        self._rules = rules or RouteRules(route)
        # A proxy's route drops control messages and counts events, as the Messaging Bridge's
        # proxies see them; so does a route that publishes (a Subscribe is no event to publish);
        # any other written route forwards whatever it takes, uncounted.
        self._drops_control = isinstance(route, DerivedRoute) or route.publish
        self._counts_events = self._drops_control
        self._stopping = asyncio.Event()
        self._busy = 0
        self._not_ready: set[int] = set(range(route.concurrency))
        self._loop_states = ["starting"] * route.concurrency
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
            self._set_state("stopped")

    def _set_state(self, state: str) -> None:
        old = self.stats.state
        if old != state:
            log.info(
                "route %s: %s -> %s",
                self.route.name,
                old,
                state,
                extra={"route": self.route.name, "state": state, "previous_state": old},
            )
            self.stats.state = state

    def _set_loop_state(self, index: int, state: str) -> None:
        """One loop's state; the route's follows from all of them (see the module docstring)."""
        self._loop_states[index] = state
        if self.stats.state in ("failed", "stopped"):
            return
        if "failing" in self._loop_states:
            self._set_state("failing")
        elif "backoff" in self._loop_states:
            self._set_state("backoff")
        elif all(s == "running" for s in self._loop_states):
            self._set_state("running")
        else:
            self._set_state("starting")

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
                        self._set_state("failed")
                        self.stop()
                        return
                    reached = self._probe is None
                    if retriable:
                        await self._back_off(index, exc, backoff, aborted)
                    else:
                        await self._back_off(index, exc, slow, aborted, permanent=True)
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
                    await self._forward(batch, sink)
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
        if self._loop_states[index] != "running":
            self._set_loop_state(index, "running")
        return empty

    async def _forward(self, batch: ReceivedBatch, sink: Sink) -> None:
        now = time.time()
        originals = [e for e in batch.messages if e.expires_at is None or e.expires_at > now]
        expired = batch.expired + len(batch.messages) - len(originals)
        if self._drops_control:
            originals = self._without_control(originals)
        refused: list[BaseException] = []
        with self.tracing.batch(originals):
            live = await self._send(batch, sink, originals, refused)
            await batch.commit()
        failed = len(batch.poison) + len(originals) - len(live)
        stats = self.stats
        stats.forwarded += len(live)
        stats.expired += expired
        stats.poison += failed
        stats.batches += 1
        self.metrics.forwarded(live, expired, failed)
        if self._counts_events:
            self._count_events(live)
        if failed:
            self._log_error_queue(failed, batch, refused)

    def _without_control(self, envelopes: list[Envelope]) -> list[Envelope]:
        """`envelopes` but Subscribe/Unsubscribe control messages (NServiceBus's, and NGinn's
        SubscribeRequest/UnsubscribeRequest: `is_control`), which leave with the commit
        (EndpointProxyFactory.cs:27-29 of Particular/NServiceBus.MessagingBridge@ef463cf)."""
        kept = [e for e in envelopes if not is_control(e.headers)]
        dropped = len(envelopes) - len(kept)
        if dropped:
            self.stats.control_dropped += dropped
            self.metrics.control_dropped(dropped)
            log.debug(
                "route %s: dropped %d Subscribe/Unsubscribe control message(s)",
                self.route.name,
                dropped,
                extra={"route": self.route.name},
            )
        return kept

    def _count_events(self, envelopes: list[Envelope]) -> None:
        counts = self.stats.published
        carried = getattr(self.route, "event", None)  # an event route's type, for untyped records
        for envelope in envelopes:
            if self.route.publish or is_published(envelope.headers):
                event = topics_of(published(envelope, carried).headers)[0]
                counts[event] = counts.get(event, 0) + 1
                self.metrics.published(event)

    def _log_error_queue(
        self, failed: int, batch: ReceivedBatch, refused: list[BaseException]
    ) -> None:
        """One line per batch, never per message: how many, where, and the first reason."""
        reason = batch.poison[0].reason if batch.poison else str(refused[0]) if refused else "?"
        route = self.route
        queue = None if self._keeps_failed else route.error_queue_name
        log.warning(
            "route %s: %d message(s) moved to %s on connection %s: %s",
            route.name,
            failed,
            "their table's failed rows" if queue is None else f"error queue {queue}",
            route.from_.connection,
            reason,
            extra={
                "route": route.name,
                "state": self.stats.state,
                "error_queue": queue,
                "failed": failed,
            },
        )

    async def _send(
        self,
        batch: ReceivedBatch,
        sink: Sink,
        originals: list[Envelope],
        refused: list[BaseException],
    ) -> list[Envelope]:
        """Send the batch; a message refused for good is rejected and the rest sent again.

        Returns what the destination accepted; `refused` gets the reason of each rejection.
        When the sink cannot say which message it refused, each is sent alone to find out; when
        it says it accepted the rest (`MessagesRejected.rest_accepted`), the rest is not sent
        again.
        """
        if self._rules.identity and not self.tracing.enabled:
            pairs = [(original, original) for original in originals]  # nothing to rewrite
        else:
            pairs = self._rewrite(batch, originals, refused)
        while True:
            try:
                if pairs or batch.checkpoint:
                    await sink.send([out for _, out in pairs], batch.checkpoint)
                return [out for _, out in pairs]
            except MessageRejected as exc:
                named = self._refused(exc, len(pairs))
                if named:
                    for index, rejection in sorted(named.items()):
                        batch.reject(pairs[index][0], rejection)
                        refused.append(rejection)
                    pairs = [pair for i, pair in enumerate(pairs) if i not in named]
                    if isinstance(exc, MessagesRejected) and exc.rest_accepted:
                        if batch.checkpoint:
                            await sink.send([], batch.checkpoint)
                        return [out for _, out in pairs]
                    continue
                if len(pairs) <= 1:
                    if pairs:
                        batch.reject(pairs.pop()[0], exc)
                        refused.append(exc)
                    continue
            return await self._send_one_by_one(batch, sink, pairs, refused)

    def _rewrite(
        self, batch: ReceivedBatch, originals: list[Envelope], refused: list[BaseException]
    ) -> list[tuple[Envelope, Envelope]]:
        """Each message with the route's rules applied; one they refuse is rejected."""
        forward = self.tracing.forward
        pairs = []
        for original in originals:
            try:
                pairs.append((original, forward(self._rules(original))))
            except MessageRejected as exc:
                batch.reject(original, exc)
                refused.append(exc)
        return pairs

    @staticmethod
    def _refused(exc: MessageRejected, count: int) -> dict[int, MessageRejected]:
        """Each refused message's index and error; empty when `exc` does not name them all."""
        each = exc.rejections if isinstance(exc, MessagesRejected) else (exc,)
        refused = {r.index: r for r in each if r.index is not None and 0 <= r.index < count}
        return refused if len(refused) == len(each) else {}

    async def _send_one_by_one(
        self,
        batch: ReceivedBatch,
        sink: Sink,
        pairs: list[tuple[Envelope, Envelope]],
        refused: list[BaseException],
    ) -> list[Envelope]:
        accepted = []
        for original, out in pairs:
            try:
                await sink.send([out])
                accepted.append(out)
            except MessageRejected as exc:
                batch.reject(original, exc)
                refused.append(exc)
        if batch.checkpoint:
            await sink.send([], batch.checkpoint)
        return accepted

    async def _back_off(
        self, index: int, exc: Exception, backoff: Backoff, aborted: int, *, permanent: bool = False
    ) -> None:
        """Wait before the loop tries again; `aborted` messages went back to the source.
        `permanent`: the error will not go away by retrying (see the module docstring)."""
        self.stats.retried += 1
        self.stats.retried_messages += aborted
        self.metrics.retried(aborted)
        self.stats.last_error = f"{type(exc).__name__}: {exc}"
        self.stats.last_error_at = time.time()
        delay = backoff.next_delay()
        self._set_loop_state(index, "failing" if permanent else "backoff")
        extra = {"route": self.route.name, "state": self.stats.state}
        if permanent:
            log.error(
                "route %s: %s; this will not go away on its own: fix it (the credentials, the "
                "permissions, or what is missing) and the route resumes; trying again in %.0fs",
                self.route.name,
                self.stats.last_error,
                delay,
                extra=extra,
            )
        else:
            log.warning(
                "route %s: %s; retrying in %.2fs",
                self.route.name,
                self.stats.last_error,
                delay,
                extra=extra,
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=delay)


async def _close(source: Source, sink: Sink) -> None:
    for closeable in (source, sink):
        try:
            await closeable.close()
        except Exception as exc:  # closing must not hide the reason the loop ended
            log.debug("close failed: %s", exc)
