"""Events on the way through a proxy, on the in-memory transport: control messages dropped,
published events counted by type.

The Messaging Bridge's proxies drop Subscribe/Unsubscribe control messages, the intent read
without regard to case (Particular/NServiceBus.MessagingBridge@ef463cf src/NServiceBus.
MessagingBridge/EndpointProxyFactory.cs:27-29, 72-81), and forward everything else.
"""

from __future__ import annotations

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from bridge.config.models import DerivedRoute, Route
from bridge.envelope import Envelope, Headers
from bridge.telemetry.metrics import Metrics
from bridge.transports.memory import Broker, Transport
from tests.conftest import unique
from tests.unit.test_runner import run_until, runner_for

PLACED = "Sales.OrderPlaced, Sales, Version=1.0.0.0"
EXPRESS = "Sales.ExpressOrderPlaced, Sales, Version=1.0.0.0"


def message(i: int, intent: str | None, *types: str) -> Envelope:
    headers = [("NServiceBus.MessageId", f"id-{i}")]
    if intent is not None:
        headers.append(("NServiceBus.MessageIntent", intent))
    if types:
        headers.append(("NServiceBus.EnclosedMessageTypes", ";".join(types)))
    return Envelope(Headers(headers), b"{}")


def derived_route() -> DerivedRoute:
    return DerivedRoute.model_validate(
        {
            "name": "proxy.a.Shipping",
            "endpoint": "Shipping",
            "from": {"connection": "a", "queue": unique("proxy")},
            "to": {"connection": "b", "queue": unique("Shipping")},
        }
    )


async def test_a_proxy_drops_control_messages_and_counts_events_by_type() -> None:
    transport = Transport(broker=Broker())
    route = derived_route()
    await transport.sink(route.from_.address).send(
        [
            message(0, "Subscribe"),
            message(1, "Publish", EXPRESS, PLACED),
            message(2, "unsubscribe"),  # as the Messaging Bridge parses it: any case
            message(3, "Send"),
            message(4, "Publish", PLACED),
            message(5, "Publish", EXPRESS, PLACED),
        ]
    )
    reader = InMemoryMetricReader()
    metrics = Metrics(MeterProvider(metric_readers=[reader]))
    runner = runner_for(route, transport, metrics=metrics)
    destination = transport.broker.queue(route.to.address)
    await run_until(runner, lambda: len(destination) == 4)
    assert [e.message_id for e in destination] == ["id-1", "id-3", "id-4", "id-5"]  # type: ignore[union-attr]
    assert not transport.broker.queue(route.from_.address)  # the dropped ones left too
    assert runner.stats.control_dropped == 2
    assert runner.stats.published == {"Sales.ExpressOrderPlaced": 2, "Sales.OrderPlaced": 1}
    data = reader.get_metrics_data()
    assert data is not None
    points = {
        (m.name, p.attributes.get("event")): p.value
        for r in data.resource_metrics
        for sm in r.scope_metrics
        for m in sm.metrics
        if m.name in ("bridge_events_published", "bridge_control_messages_dropped")
        for p in m.data.data_points
    }
    assert points == {
        ("bridge_events_published", "Sales.ExpressOrderPlaced"): 2,
        ("bridge_events_published", "Sales.OrderPlaced"): 1,
        ("bridge_control_messages_dropped", None): 2,
    }


async def test_a_proxy_drops_nginns_subscription_requests() -> None:
    """NGinn subscribes by sending its publisher a SubscribeRequest (UnsubscribeRequest to end
    it: lafar6502/nginn-messagebus @1fa4baf Impl/MessageBus.cs:500-508, Messages/
    SubscribeRequest.cs:6-11, UnsubscribeRequest.cs:6-8); one that reaches a proxy on NGinn
    tables (its `$type` in EnclosedMessageTypes, as the row mapping reads it) is dropped and
    counted, as NServiceBus's Subscribe is."""
    transport = Transport(broker=Broker())
    route = derived_route()
    nginn = "NGinnBPM.MessageBus.Messages.{}, NGinnBPM.MessageBus"
    await transport.sink(route.from_.address).send(
        [
            message(0, "Send", nginn.format("SubscribeRequest")),
            message(1, "Send", nginn.format("UnsubscribeRequest")),
            message(2, "Send", "Sales.SubscribeRequest, Sales"),  # a command of that name
            message(3, "Send", PLACED, nginn.format("SubscribeRequest")),  # not its own type
        ]
    )
    runner = runner_for(route, transport)
    destination = transport.broker.queue(route.to.address)
    await run_until(runner, lambda: len(destination) == 2)
    assert [e.message_id for e in destination] == ["id-2", "id-3"]  # type: ignore[union-attr]
    assert runner.stats.control_dropped == 2


async def test_a_written_route_that_publishes_drops_control_messages_too() -> None:
    """A Subscribe that reaches a topic a written `publish: true` route reads is no event: it
    is not published to every subscriber (as a proxy drops it, EndpointProxyFactory.cs:72-81)."""
    transport = Transport(broker=Broker())
    route = Route.model_validate(
        {
            "name": "legacy-stock",
            "from": {"connection": "a", "queue": unique("legacy")},
            "to": {"connection": "b", "queue": unique("published")},
            "publish": True,
        }
    )
    await transport.sink(route.from_.address).send(
        [message(0, "Subscribe", PLACED), message(1, None, PLACED), message(2, "Unsubscribe")]
    )
    runner = runner_for(route, transport)
    destination = transport.broker.queue(route.to.address)
    await run_until(runner, lambda: runner.stats.control_dropped == 2 and len(destination) == 1)
    assert [e.message_id for e in destination] == ["id-1"]  # type: ignore[union-attr]
    assert runner.stats.published == {"Sales.OrderPlaced": 1}
