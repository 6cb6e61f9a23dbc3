"""One received batch forwarded: drop expired -> drop control -> rules -> send -> commit -> count.

Guarantees
    The batch is committed only after the send (`bridge.routing.sending`) returned, i.e. after
    the destination durably accepted every message it did not refuse; an error from the send
    leaves here before the commit, and the caller's `async with batch` returns the batch to its
    source (a commit that fails leaves it there too: `bridge.batch`). Expired messages are not
    sent: they leave with the commit, counted. A proxy's route, and a route that publishes,
    drops Subscribe/Unsubscribe control messages (they leave with the commit too) and counts the
    events it forwards by type; any other route forwards whatever it takes, uncounted.

Logs
    Each batch that sent messages to the error queue: one WARNING per batch (how many, where,
    the first reason), never a line per message, with `route` and `state` as structured fields.
"""

from __future__ import annotations

import logging
import time

from bridge.config.models import DerivedRoute, Route
from bridge.envelope import Envelope
from bridge.nservicebus.events import is_control, is_published, published, topics_of
from bridge.protocols import ReceivedBatch, Sink
from bridge.routing.rules import RouteRules
from bridge.routing.sending import BatchSender
from bridge.routing.state import RouteStats
from bridge.telemetry.metrics import RouteMetrics
from bridge.telemetry.tracing import RouteTracing

__all__ = ["BatchForwarder"]

log = logging.getLogger("bridge.route")


class BatchForwarder:
    """Forwards one route's received batches to a sink; counts them in `stats` and `metrics`."""

    def __init__(
        self,
        route: Route,
        stats: RouteStats,
        metrics: RouteMetrics,
        tracing: RouteTracing,
        rules: RouteRules,
        *,
        keeps_failed: bool,
    ) -> None:
        self.route = route
        self._stats = stats
        self._metrics = metrics
        self._tracing = tracing
        self._sender = BatchSender(rules, tracing)
        #: The source keeps what it cannot forward in its own table (no error queue named).
        self._keeps_failed = keeps_failed
        # A proxy's route drops control messages and counts events, as the Messaging Bridge's
        # proxies see them; so does a route that publishes (a Subscribe is no event to publish);
        # any other written route forwards whatever it takes, uncounted.
        self._sees_events = isinstance(route, DerivedRoute) or route.publish

    async def forward(self, batch: ReceivedBatch, sink: Sink) -> None:
        """Send `batch` to `sink` and commit it (see the module docstring)."""
        now = time.time()
        originals = [e for e in batch.messages if e.expires_at is None or e.expires_at > now]
        expired = batch.expired + len(batch.messages) - len(originals)
        if self._sees_events:
            originals = self._without_control(originals)
        refused: list[BaseException] = []
        with self._tracing.batch(originals):
            live = await self._sender.send(batch, sink, originals, refused)
            await batch.commit()
        failed = len(batch.poison) + len(originals) - len(live)
        stats = self._stats
        stats.forwarded += len(live)
        stats.expired += expired
        stats.poison += failed
        stats.batches += 1
        self._metrics.forwarded(live, expired, failed)
        if self._sees_events:
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
            self._stats.control_dropped += dropped
            self._metrics.control_dropped(dropped)
            log.debug(
                "route %s: dropped %d Subscribe/Unsubscribe control message(s)",
                self.route.name,
                dropped,
                extra={"route": self.route.name},
            )
        return kept

    def _count_events(self, envelopes: list[Envelope]) -> None:
        counts = self._stats.published
        carried = getattr(self.route, "event", None)  # an event route's type, for untyped records
        for envelope in envelopes:
            if self.route.publish or is_published(envelope.headers):
                event = topics_of(published(envelope, carried).headers)[0]
                counts[event] = counts.get(event, 0) + 1
                self._metrics.published(event)

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
                "state": self._stats.state,
                "error_queue": queue,
                "failed": failed,
            },
        )
