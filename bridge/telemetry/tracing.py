"""Traces that cross transports: endpoint -> SQL -> bridge -> Kafka/RabbitMQ -> consumer.

For each message the bridge continues the trace found in its W3C `traceparent`/`tracestate`
headers with a PRODUCER span of its own, and writes that span's context back into the outgoing
`traceparent` (a documented header translation, as every instrumented hop does). Each batch gets
one span linked to the context of every message in it. `baggage` crosses untouched.

Tracing is on when a TracerProvider of the SDK is installed: `setup_tracing()` installs one
exporting over OTLP/HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set. Otherwise nothing is
recorded and headers are not touched at all.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from bridge.config.models import Route
from bridge.envelope import Envelope, Headers

__all__ = ["RouteTracing", "setup_tracing"]

_W3C = TraceContextTextMapPropagator()


def setup_tracing(service_name: str = "bridge") -> bool:
    """Install an OTLP-exporting provider when OTEL_EXPORTER_OTLP_ENDPOINT is set."""
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return True


def _carrier(headers: Headers) -> dict[str, str]:
    return {
        name: value
        for name in ("traceparent", "tracestate")
        if (value := headers.get(name)) is not None
    }


def _context_of(envelope: Envelope) -> Context:
    return _W3C.extract(_carrier(envelope.headers))


class RouteTracing:
    def __init__(self, route: Route, provider: trace.TracerProvider | None = None) -> None:
        provider = provider or trace.get_tracer_provider()
        self.enabled = isinstance(provider, TracerProvider)
        self._tracer = provider.get_tracer("bridge")
        self._route = route.name
        self._attributes: dict[str, Any] = {
            "bridge.route": route.name,
            "messaging.source.name": route.from_.address,
            "messaging.destination.name": route.to.address,
        }

    def batch(self, envelopes: list[Envelope]) -> AbstractContextManager[object]:
        """A span for one batch, linked to every message's own trace."""
        if not self.enabled:
            return nullcontext()
        links = []
        for envelope in envelopes:
            context = trace.get_current_span(_context_of(envelope)).get_span_context()
            if context.is_valid:
                links.append(Link(context))
        return self._tracer.start_as_current_span(
            f"{self._route} batch",
            links=links,
            attributes={**self._attributes, "messaging.batch.message_count": len(envelopes)},
        )

    def forward(self, envelope: Envelope) -> Envelope:
        """Continue the message's trace; the outgoing copy carries the bridge's span."""
        if not self.enabled:
            return envelope
        with self._tracer.start_as_current_span(
            f"{self._route} publish",
            context=_context_of(envelope),
            kind=SpanKind.PRODUCER,
            attributes={**self._attributes, "messaging.message.id": envelope.message_id or ""},
        ):
            carrier: dict[str, str] = {}
            _W3C.inject(carrier)
        headers = envelope.headers.copy()
        for name, value in carrier.items():
            headers.set(name, value)
        return envelope.with_headers(headers)
