"""Route metrics through the OpenTelemetry SDK, exported for Prometheus.

`Metrics.setup()` installs one MeterProvider whose PrometheusMetricReader feeds the
prometheus_client registry that `/metrics` renders. Instruments (all with a `route` attribute):

- `bridge_messages_forwarded_total`, `..._expired_total`, `..._failed_total` (to an error queue),
  `..._retried_total` (messages of a batch that was aborted and goes back to be retried)
- `bridge_batches_retried_total` (failed attempts: each one put a loop into backoff)
- `bridge_messages_delayed_total` (forwarded with a delay still to come, which the destination
  holds until due), with a `destination` attribute too: `<connection>/<address>`
- `bridge_events_published_total` (published events a derived route forwarded or published),
  with an `event` attribute too: the most derived type the event carries
- `bridge_control_messages_dropped_total` (Subscribe/Unsubscribe control messages a proxy's
  route dropped, as the Messaging Bridge drops them)
- `bridge_nginn_copies_skipped_total` (copies of events published onto NGinn tables that were
  not written: a subscriber row names an endpoint of another database, `reason="other_database"`,
  or the publisher itself, `reason="publisher"`; `nginn_publish.py`), with `subscriber` and
  `reason` attributes too
- `bridge_batch_size` and `bridge_batch_duration_seconds` histograms (buckets from 1 ms up to
  an hour: a drained backlog is minutes old)
- `bridge_end_to_end_latency_seconds` from `NServiceBus.TimeSent` to the destination's accept,
  sampled: one forwarded message in `LATENCY_SAMPLE_EVERY`, counted across batches, so a big
  batch weighs as much as the same number of messages in small ones (its quantiles and mean
  are those of all messages; count messages with `..._forwarded_total`)
- `bridge_messages_in_flight` (received, not yet settled), `bridge_source_depth` (messages
  waiting at the source, as last looked at: a Kafka source's is its consumer group's lag)

Every counter of a route exists at 0 from the moment the route's metrics are made, so the first
event is an increase Prometheus can see.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

from bridge.envelope import TIME_SENT, Envelope
from bridge.nservicebus.wireformat import timestamp_seconds

__all__ = ["Metrics", "RouteMetrics"]

#: One forwarded message in this many goes into the latency histogram.
LATENCY_SAMPLE_EVERY = 32

SECONDS_BUCKETS = (
    *(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
    *(1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600),
)
SIZE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


class Metrics:
    """The process's instruments; one per process, shared by every route."""

    def __init__(self, provider: MeterProvider | None = None) -> None:
        self.provider = provider or MeterProvider()
        meter = self.provider.get_meter("bridge")
        self.forwarded = meter.create_counter(
            "bridge_messages_forwarded", unit="1", description="Messages the destination accepted"
        )
        self.expired = meter.create_counter(
            "bridge_messages_expired", unit="1", description="Expired messages dropped"
        )
        self.failed = meter.create_counter(
            "bridge_messages_failed", unit="1", description="Messages moved to an error queue"
        )
        self.retried = meter.create_counter(
            "bridge_messages_retried",
            unit="1",
            description="Messages of a batch that was aborted; they stay at the source for a retry",
        )
        self.retried_batches = meter.create_counter(
            "bridge_batches_retried", unit="1", description="Failed attempts that went into backoff"
        )
        self.delayed = meter.create_counter(
            "bridge_messages_delayed",
            unit="1",
            description="Messages forwarded with a delay the destination holds until due",
        )
        self.events_published = meter.create_counter(
            "bridge_events_published",
            unit="1",
            description="Published events forwarded or published, by event type",
        )
        self.control_dropped = meter.create_counter(
            "bridge_control_messages_dropped",
            unit="1",
            description="Subscribe/Unsubscribe control messages a proxy's route dropped",
        )
        self.nginn_skipped = meter.create_counter(
            "bridge_nginn_copies_skipped",
            unit="1",
            description="Copies of events published onto NGinn tables not written, by "
            "subscriber endpoint and reason (other_database, publisher)",
        )
        self.batch_size = meter.create_histogram(
            "bridge_batch_size", unit="1", description="Messages per received batch"
        )
        self.batch_duration = meter.create_histogram(
            "bridge_batch_duration", unit="s", description="Receive-to-commit time of a batch"
        )
        self.latency = meter.create_histogram(
            "bridge_end_to_end_latency",
            unit="s",
            description="From NServiceBus.TimeSent to the destination's accept",
        )
        self.in_flight = meter.create_up_down_counter(
            "bridge_messages_in_flight", unit="1", description="Received, not yet settled"
        )
        self._depths: dict[str, int] = {}
        meter.create_observable_gauge(
            "bridge_source_depth",
            callbacks=[self._observe_depths],
            unit="1",
            description="Messages waiting at the route's source (a Kafka source: its group's lag)",
        )

    @classmethod
    def setup(cls) -> Metrics:
        """The process's provider, exporting to the prometheus_client default registry."""
        global _PROCESS_METRICS
        if _PROCESS_METRICS is not None:
            return _PROCESS_METRICS
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        views = [
            View(
                instrument_name="bridge_batch_duration",
                aggregation=ExplicitBucketHistogramAggregation(SECONDS_BUCKETS),
            ),
            View(
                instrument_name="bridge_end_to_end_latency",
                aggregation=ExplicitBucketHistogramAggregation(SECONDS_BUCKETS),
            ),
            View(
                instrument_name="bridge_batch_size",
                aggregation=ExplicitBucketHistogramAggregation(SIZE_BUCKETS),
            ),
        ]
        reader = PrometheusMetricReader()
        # Prometheus text has no exemplars: offering every measurement to a reservoir is waste.
        provider = MeterProvider(
            metric_readers=[reader], views=views, exemplar_filter=AlwaysOffExemplarFilter()
        )
        _PROCESS_METRICS = cls(provider)
        return _PROCESS_METRICS

    def _observe_depths(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(depth, {"route": route}) for route, depth in self._depths.items()]

    def set_depth(self, route: str, depth: int) -> None:
        self._depths[route] = depth

    def for_route(self, route: str, destination: str = "") -> RouteMetrics:
        """A route's instruments; `destination` (`<connection>/<address>`) labels its delays."""
        return RouteMetrics(self, route, destination)

    def shutdown(self) -> None:
        self.provider.shutdown()


_PROCESS_METRICS: Metrics | None = None


class RouteMetrics:
    def __init__(self, metrics: Metrics, route: str, destination: str = "") -> None:
        self._m = metrics
        self._attrs = {"route": route}
        self._delay_attrs = {"route": route, "destination": destination}
        self._next_sample = 0  # index, in the next batch, of the next message to sample
        for counter in (
            metrics.forwarded,
            metrics.expired,
            metrics.failed,
            metrics.retried,
            metrics.retried_batches,
            metrics.in_flight,
            metrics.control_dropped,
        ):
            counter.add(0, self._attrs)
        metrics.delayed.add(0, self._delay_attrs)

    def received(self, count: int) -> None:
        self._m.in_flight.add(count, self._attrs)
        self._m.batch_size.record(count, self._attrs)

    def settled(self, count: int, started: float) -> None:
        self._m.in_flight.add(-count, self._attrs)
        self._m.batch_duration.record(time.perf_counter() - started, self._attrs)

    def forwarded(self, envelopes: Sequence[Envelope], expired: int, failed: int) -> None:
        attrs = self._attrs
        if envelopes:
            self._m.forwarded.add(len(envelopes), attrs)
            # A histogram record per message would be a large share of a message's CPU; every
            # K-th message of the stream gives the same distribution, whatever the batch sizes.
            start, every = self._next_sample, LATENCY_SAMPLE_EVERY
            self._next_sample = (start - len(envelopes)) % every
            now = time.time()
            delayed = sum(1 for e in envelopes if e.deliver_at is not None and e.deliver_at > now)
            if delayed:
                self._m.delayed.add(delayed, self._delay_attrs)
            for envelope in envelopes[start::every]:
                sent = envelope.headers.get(TIME_SENT)
                if sent:
                    try:
                        moment = timestamp_seconds(sent)
                    except ValueError:
                        continue
                    self._m.latency.record(max(0.0, now - moment), attrs)
        if expired:
            self._m.expired.add(expired, attrs)
        if failed:
            self._m.failed.add(failed, attrs)

    def published(self, event: str) -> None:
        self._m.events_published.add(1, {**self._attrs, "event": event})

    def control_dropped(self, count: int) -> None:
        self._m.control_dropped.add(count, self._attrs)

    def nginn_skipped(self, subscriber: str, reason: str) -> None:
        """A copy of an event published onto NGinn tables that was not written."""
        self._m.nginn_skipped.add(1, {**self._attrs, "subscriber": subscriber, "reason": reason})

    def retried(self, messages: int) -> None:
        """A failed attempt; `messages` were in hand and go back to the source."""
        self._m.retried_batches.add(1, self._attrs)
        if messages:
            self._m.retried.add(messages, self._attrs)
