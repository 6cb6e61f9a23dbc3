"""The trace goes on through the bridge: same trace id, the bridge's span as the new parent."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracerProvider, SpanKind

from bridge.config.models import Route
from bridge.envelope import Envelope, Headers
from bridge.telemetry.tracing import RouteTracing

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
ROUTE = Route.model_validate(
    {
        "name": "r",
        "from": {"connection": "a", "queue": "Sales"},
        "to": {"connection": "b", "topic": "t"},
    }
)


def traced(i: int) -> Envelope:
    headers = Headers(
        [
            ("NServiceBus.MessageId", f"id-{i}"),
            ("traceparent", f"00-{TRACE_ID}-{PARENT}-01"),
            ("tracestate", "vendor=1"),
            ("baggage", "k=v"),
        ]
    )
    return Envelope(headers, b"x")


def provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    return tracer_provider, exporter


def test_outgoing_message_carries_the_bridge_span_in_the_same_trace() -> None:
    tracer_provider, exporter = provider()
    tracing = RouteTracing(ROUTE, tracer_provider)
    original = traced(1)
    out = tracing.forward(original)
    (span,) = exporter.get_finished_spans()
    assert span.kind == SpanKind.PRODUCER
    assert span.parent is not None and f"{span.parent.span_id:016x}" == PARENT
    assert f"{span.context.trace_id:032x}" == TRACE_ID
    assert out.headers.get("traceparent") == f"00-{TRACE_ID}-{span.context.span_id:016x}-01"
    assert out.headers.get("tracestate") == "vendor=1"
    assert out.headers.get("baggage") == "k=v"
    assert out.headers.names() == original.headers.names()
    assert original.headers.get("traceparent") == f"00-{TRACE_ID}-{PARENT}-01"


def test_message_without_a_trace_starts_one() -> None:
    tracer_provider, _ = provider()
    out = RouteTracing(ROUTE, tracer_provider).forward(Envelope(Headers([("a", "b")]), b""))
    assert (out.headers.get("traceparent") or "").startswith("00-")


def test_batch_span_links_every_message() -> None:
    tracer_provider, exporter = provider()
    tracing = RouteTracing(ROUTE, tracer_provider)
    with tracing.batch([traced(1), traced(2), Envelope(Headers(), b"")]):
        pass
    (span,) = exporter.get_finished_spans()
    assert len(span.links) == 2
    assert all(f"{link.context.span_id:016x}" == PARENT for link in span.links)


def test_without_an_sdk_provider_headers_are_untouched() -> None:
    tracing = RouteTracing(ROUTE, NoOpTracerProvider())
    original = traced(1)
    assert tracing.forward(original) is original


def test_a_traced_message_keeps_its_delay_request_and_lifetime() -> None:
    tracer_provider, _ = provider()
    original = traced(1)
    original.deliver_at, original.expires_at = 2_000_000_000.0, 2_000_000_060.0
    out = RouteTracing(ROUTE, tracer_provider).forward(original)
    assert (out.deliver_at, out.expires_at) == (2_000_000_000.0, 2_000_000_060.0)
