"""Route metrics read back through the SDK: counters from 0, an unbiased latency sample."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

from bridge.envelope import Envelope, Headers
from bridge.nservicebus.wireformat import format_timestamp
from bridge.telemetry.metrics import LATENCY_SAMPLE_EVERY, SECONDS_BUCKETS, Metrics


def metrics() -> tuple[Metrics, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    view = View(
        instrument_name="bridge_end_to_end_latency",
        aggregation=ExplicitBucketHistogramAggregation(SECONDS_BUCKETS),
    )
    return Metrics(MeterProvider(metric_readers=[reader], views=[view])), reader


def points(reader: InMemoryMetricReader) -> dict[str, Any]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        metric.name: metric.data.data_points[0]
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }


def sent_at(moment: float) -> Envelope:
    stamp = format_timestamp(datetime.fromtimestamp(moment, UTC))
    return Envelope(Headers([("NServiceBus.TimeSent", stamp)]), b"")


def test_every_counter_of_a_route_starts_at_zero() -> None:
    m, reader = metrics()
    m.for_route("r")
    found = points(reader)
    for name in (
        "bridge_messages_forwarded",
        "bridge_messages_expired",
        "bridge_messages_failed",
        "bridge_messages_retried",
        "bridge_batches_retried",
        "bridge_messages_in_flight",
    ):
        assert found[name].value == 0 and dict(found[name].attributes) == {"route": "r"}


def test_retried_counts_attempts_and_the_messages_sent_back() -> None:
    m, reader = metrics()
    route = m.for_route("r")
    route.retried(10)
    route.retried(0)  # failed before anything was received
    found = points(reader)
    assert found["bridge_batches_retried"].value == 2
    assert found["bridge_messages_retried"].value == 10


def test_latency_sample_weighs_messages_not_batches() -> None:
    """1,600 old messages in one batch, then 1,600 fresh ones one per batch: half and half."""
    m, reader = metrics()
    route = m.for_route("r")
    now = time.time()
    route.forwarded([sent_at(now - 1000) for _ in range(1600)], 0, 0)  # 1,000 s on the way
    for _ in range(1600):
        route.forwarded([sent_at(now + 1000)], 0, 0)  # a clock ahead of ours: latency 0
    latency = points(reader)["bridge_end_to_end_latency"]
    assert latency.count == 2 * 1600 // LATENCY_SAMPLE_EVERY
    bounds = list(latency.explicit_bounds)
    zero = latency.bucket_counts[0]  # le 0.001
    old = sum(latency.bucket_counts[bounds.index(900) + 1 : bounds.index(3600) + 1])
    assert zero == old == 1600 // LATENCY_SAMPLE_EVERY


def test_the_sample_runs_on_across_batches_of_any_size() -> None:
    m, reader = metrics()
    route = m.for_route("r")
    now = time.time()
    sizes = [3, 1, 7, 2, 5, 11, 1, 1, 9, 40]  # 80 messages
    for size in sizes:
        route.forwarded([sent_at(now) for _ in range(size)], 0, 0)
    sampled = len(range(0, sum(sizes), LATENCY_SAMPLE_EVERY))  # the 1st, the K+1-th, ...
    assert points(reader)["bridge_end_to_end_latency"].count == sampled


def test_delayed_messages_are_counted_by_destination() -> None:
    m, reader = metrics()
    route = m.for_route("r", "rabbit/Billing")
    assert points(reader)["bridge_messages_delayed"].value == 0
    now = time.time()
    later, due = sent_at(now), sent_at(now)
    later.deliver_at, due.deliver_at = now + 60, now - 1
    route.forwarded([later, due, sent_at(now)], 0, 0)
    delayed = points(reader)["bridge_messages_delayed"]
    assert delayed.value == 1
    assert dict(delayed.attributes) == {"route": "r", "destination": "rabbit/Billing"}
