"""The route runner on the in-memory transport: what leaves the source, and when."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from bridge.batch import Batch
from bridge.config.models import Route
from bridge.envelope import Envelope, Headers
from bridge.errors import (
    AccessRefused,
    MessageRejected,
    MessagesRejected,
    TransportError,
    TransportUnavailable,
)
from bridge.protocols import Checkpoint, Sink, Source
from bridge.routing.retry import Backoff
from bridge.routing.runner import Probe, RouteRunner
from bridge.routing.state import PERMANENT_RETRY_MAX, RETRY_MAX
from bridge.telemetry.logs import JsonFormatter
from bridge.telemetry.metrics import Metrics
from bridge.transports.memory import Broker, MemorySink, Transport
from tests.conftest import unique


def message(i: int, **extra: str | None) -> Envelope:
    headers = Headers([("NServiceBus.MessageId", f"id-{i}"), *extra.items()])
    return Envelope(headers, f"body-{i}".encode())


def make_route(**options: object) -> Route:
    return Route.model_validate(
        {
            "name": "r",
            "from": {"connection": "a", "queue": unique("src")},
            "to": {"connection": "b", "queue": unique("dst")},
            **options,
        }
    )


class FlakySink:
    """Fails the first `failures` sends with the given error, then delegates."""

    def __init__(self, inner: Sink, failures: int, error: Exception) -> None:
        self.inner, self.failures, self.error, self.calls = inner, failures, error, 0

    async def send(
        self, envelopes: Sequence[Envelope], checkpoint: Checkpoint | None = None
    ) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        await self.inner.send(envelopes, checkpoint)

    async def close(self) -> None:
        await self.inner.close()


async def run_until(runner: RouteRunner, condition: object, timeout: float = 10.0) -> None:
    task = asyncio.create_task(runner.run())
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"condition not met; stats={runner.stats}"
        assert not task.done(), task
        await asyncio.sleep(0.01)
    runner.stop()
    await asyncio.wait_for(task, 10)


def runner_for(
    route: Route,
    transport: Transport,
    sink: Sink | None = None,
    *,
    metrics: Metrics | None = None,
    probe: Probe | None = None,
) -> RouteRunner:
    def endpoints() -> tuple[Source, Sink]:
        source = transport.source(route.from_.address, error_queue=route.error_queue_name)
        return source, sink or transport.sink(route.to.address)

    return RouteRunner(
        route,
        endpoints,
        poll_timeout=0.05,
        metrics=metrics.for_route(route.name) if metrics else None,
        probe=probe,
    )


def state_changes(caplog: pytest.LogCaptureFixture) -> list[str]:
    messages = [r.getMessage() for r in caplog.records]
    return [m for m in messages if re.fullmatch(r"route \S+: \w+ -> \w+", m)]


@pytest.mark.parametrize("ahead", [False, True], ids=["one-at-a-time", "receiving-ahead"])
async def test_forwards_everything_in_order_and_empties_the_source(ahead: bool) -> None:
    transport = Transport(broker=Broker(), receives_ahead=ahead)
    route = make_route(batch_size=7)
    await transport.sink(route.from_.address).send([message(i) for i in range(50)])
    runner = runner_for(route, transport)
    dst = transport.broker.queue(route.to.address)
    await run_until(runner, lambda: len(dst) == 50)
    assert [e.body for e in dst] == [f"body-{i}".encode() for i in range(50)]  # type: ignore[union-attr]
    assert not transport.broker.queue(route.from_.address)
    assert runner.stats.forwarded == 50 and runner.stats.batches == 8
    assert runner.stats.state == "stopped"


class CountingSink:
    """Records the size of each send (one per batch)."""

    def __init__(self, inner: Sink) -> None:
        self.inner, self.sizes = inner, list[int]()

    async def send(
        self, envelopes: Sequence[Envelope], checkpoint: Checkpoint | None = None
    ) -> None:
        self.sizes.append(len(envelopes))
        await self.inner.send(envelopes, checkpoint)

    async def close(self) -> None:
        await self.inner.close()


@pytest.mark.parametrize("ahead", [False, True], ids=["one-at-a-time", "receiving-ahead"])
async def test_batches_hold_about_batch_bytes_at_the_last_batchs_body_size(ahead: bool) -> None:
    transport = Transport(broker=Broker(), receives_ahead=ahead)
    route = make_route(batch_size=300, batch_bytes=1000)
    small = [Envelope(Headers([]), b"s" * 10) for _ in range(100)]
    large = [Envelope(Headers([]), b"L" * 50) for _ in range(160)]
    await transport.sink(route.from_.address).send([*small, *large])
    sink = CountingSink(transport.sink(route.to.address))
    runner = runner_for(route, transport, sink)
    await run_until(runner, lambda: len(transport.broker.queue(route.to.address)) == 260)
    # at most 100 until a batch has shown the sizes; at 10 bytes 1000 // 10 = 100 fit (the
    # next batch, of 50-byte bodies, runs over: the count follows the last batch); then 20
    assert sink.sizes == [100, 100, 20, 20, 20]


async def test_expired_messages_are_dropped_and_counted() -> None:
    transport = Transport(broker=Broker())
    route = make_route()
    old, fresh = message(1), message(2)
    old.expires_at = time.time() - 1
    fresh.expires_at = time.time() + 60
    await transport.sink(route.from_.address).send([old, fresh])
    runner = runner_for(route, transport)
    dst = transport.broker.queue(route.to.address)
    await run_until(runner, lambda: runner.stats.batches == 1)
    assert [e.body for e in dst] == [b"body-2"]  # type: ignore[union-attr]
    assert runner.stats.expired == 1


async def test_header_rules_and_address_map() -> None:
    transport = Transport(broker=Broker())
    route = make_route(
        headers={"rename": {"a": "b"}, "drop": ["x"], "set": {"s": "v"}},
        address_map={"Sales@[dbo]@[nsb]": '"public"."Sales"'},
    )
    src = message(1, a="1", x="gone", **{"NServiceBus.ReplyToAddress": "Sales@[dbo]@[nsb]"})
    unknown = message(2, **{"NServiceBus.ReplyToAddress": "Other@[dbo]@[nsb]"})
    await transport.sink(route.from_.address).send([src, unknown])
    runner = runner_for(route, transport)
    dst = transport.broker.queue(route.to.address)
    await run_until(runner, lambda: len(dst) == 2)
    first, second = dst
    assert first.headers.items() == [  # type: ignore[union-attr]
        ("NServiceBus.MessageId", "id-1"),
        ("b", "1"),
        ("NServiceBus.ReplyToAddress", '"public"."Sales"'),
        ("s", "v"),
    ]
    assert second.headers.get("NServiceBus.ReplyToAddress") == "Other@[dbo]@[nsb]"  # type: ignore[union-attr]


async def test_a_retry_acknowledgement_queue_is_translated_like_the_reply_address() -> None:
    """ServicePulse's retry carries `ServiceControl.Retry.AcknowledgementQueue`; the endpoint
    that processes the retry sends its acknowledgement there, so across transports it must be
    translated as the Messaging Bridge does (NServiceBus.MessagingBridge
    src/NServiceBus.MessagingBridge/MessageShovel.cs:58-68; the endpoint's side:
    NServiceBus src/NServiceBus.Core/Recoverability/RetryAcknowledgementBehavior.cs:15-37)."""
    transport = Transport(broker=Broker())
    route = make_route(
        address_map={"Particular.ServiceControl@[dbo]@[sc]": "Particular.ServiceControl"}
    )
    ack = "ServiceControl.Retry.AcknowledgementQueue"
    retried = message(1, **{ack: "Particular.ServiceControl@[dbo]@[sc]"})
    await transport.sink(route.from_.address).send([retried])
    runner = runner_for(route, transport)
    dst = transport.broker.queue(route.to.address)
    await run_until(runner, lambda: len(dst) == 1)
    (forwarded,) = dst
    assert forwarded.headers.get(ack) == "Particular.ServiceControl"  # type: ignore[union-attr]


@pytest.mark.parametrize("ahead", [False, True], ids=["one-at-a-time", "receiving-ahead"])
async def test_failing_destination_keeps_messages_at_source_until_it_recovers(ahead: bool) -> None:
    transport = Transport(broker=Broker(), receives_ahead=ahead)
    route = make_route(batch_size=10)
    await transport.sink(route.from_.address).send([message(i) for i in range(25)])
    sink = FlakySink(transport.sink(route.to.address), 3, TransportUnavailable("db down"))
    runner = runner_for(route, transport, sink)
    runner_task_seen_backoff = []

    def done() -> bool:
        if runner.stats.state == "backoff":
            runner_task_seen_backoff.append(True)
            assert len(transport.broker.queue(route.from_.address)) == 25
        return len(transport.broker.queue(route.to.address)) == 25

    await run_until(runner, done)
    assert runner_task_seen_backoff
    assert runner.stats.retried == 3
    assert runner.stats.last_error == "TransportUnavailable: db down"
    bodies = [e.body for e in transport.broker.queue(route.to.address)]  # type: ignore[union-attr]
    assert bodies == [f"body-{i}".encode() for i in range(25)]


async def test_a_route_waits_at_most_retry_max_between_attempts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """However long its destination stays down, a loop tries again at least every RETRY_MAX
    seconds (20), so it runs again within that of the destination's return (the network fault
    suite's target is 30 s). The waits are recorded, not waited."""
    drawn: list[float] = []
    draw = Backoff.next_delay

    def recorded(self: Backoff) -> float:
        drawn.append(draw(self))
        return 0.0

    monkeypatch.setattr(Backoff, "next_delay", recorded)
    transport = Transport(broker=Broker())
    route = make_route()
    await transport.sink(route.from_.address).send([message(0)])
    sink = FlakySink(transport.sink(route.to.address), 20, TransportUnavailable("down"))
    runner = runner_for(route, transport, sink)
    await run_until(runner, lambda: len(transport.broker.queue(route.to.address)) == 1)
    assert len(drawn) == 20
    assert max(drawn) <= RETRY_MAX
    assert max(drawn) >= RETRY_MAX / 2  # it did grow to the cap: 0.1 s x 2**8 > 20 s


class WatchingSink:
    """Records, during each send, how many messages are left at the source."""

    def __init__(self, inner: Sink, source: Sequence[object]) -> None:
        self.inner, self.source, self.left = inner, source, list[int]()

    async def send(
        self, envelopes: Sequence[Envelope], checkpoint: Checkpoint | None = None
    ) -> None:
        await asyncio.sleep(0.02)  # a destination round trip
        self.left.append(len(self.source))
        await self.inner.send(envelopes, checkpoint)

    async def close(self) -> None:
        await self.inner.close()


async def watched_route(count: int) -> tuple[RouteRunner, WatchingSink, Sequence[object]]:
    """A route over `count` messages that receives ahead, batches of 10, into a WatchingSink."""
    transport = Transport(broker=Broker(), receives_ahead=True)
    route = make_route(batch_size=10)
    await transport.sink(route.from_.address).send([message(i) for i in range(count)])
    sink = WatchingSink(
        transport.sink(route.to.address), transport.broker.queue(route.from_.address)
    )
    return runner_for(route, transport, sink), sink, transport.broker.queue(route.to.address)


async def test_a_source_receiving_ahead_has_the_next_batch_taken_while_one_is_sent() -> None:
    runner, sink, dst = await watched_route(40)
    await run_until(runner, lambda: len(dst) == 40)
    assert sink.left == [20, 10, 0, 0]  # one batch in the send, the next one taken
    assert [e.body for e in dst] == [f"body-{i}".encode() for i in range(40)]  # type: ignore[union-attr]


async def test_a_batch_received_ahead_goes_back_when_the_route_stops() -> None:
    runner, sink, dst = await watched_route(30)
    await run_until(runner, lambda: len(dst) >= 10)
    source = sink.source
    assert len(dst) + len(source) == 30
    assert [e.body for e in [*dst, *source]] == [f"body-{i}".encode() for i in range(30)]  # type: ignore[union-attr]


async def test_non_retriable_failure_in_drain_mode_stops_the_route_without_loss() -> None:
    transport = Transport(broker=Broker())
    route = make_route()
    await transport.sink(route.from_.address).send([message(1)])
    sink = FlakySink(transport.sink(route.to.address), 99, TransportError("bad"))
    runner = RouteRunner(
        route,
        lambda: (transport.source(route.from_.address), sink),
        poll_timeout=0.05,
        stop_on_fatal=True,
    )
    await asyncio.wait_for(runner.run(), 10)
    assert isinstance(runner.fatal, TransportError)
    assert len(transport.broker.queue(route.from_.address)) == 1


async def test_a_refused_login_makes_the_route_failing_and_retried_slowly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """In service mode a password may be fixed while the bridge runs, so the route keeps
    trying; but a refused login is not worth retrying ten times a second (or often enough to
    lock an account): the route is `failing`, not `backoff`, each failure is an ERROR that says
    it will not pass on its own, and the waits start at 1 s (jittered down to 0.5 s), not
    0.1 s. Once the login works, the route runs."""
    transport = Transport(broker=Broker())
    route = make_route()
    await transport.sink(route.from_.address).send([message(1)])
    refused = AccessRefused("postgresql connection 'shop': access refused: role does not exist")
    probes: list[str] = []

    async def probe() -> None:
        probes.append(runner.stats.state)
        if len(probes) <= 2:
            raise refused

    runner = runner_for(route, transport, probe=probe)
    seen: list[str] = []

    def done() -> bool:
        seen.append(runner.stats.state)
        return len(transport.broker.queue(route.to.address)) == 1

    with caplog.at_level(logging.INFO, logger="bridge.route"):
        await run_until(runner, done)
    assert "failing" in seen and "backoff" not in seen
    assert state_changes(caplog) == [
        "route r: starting -> failing",
        "route r: failing -> running",
        "route r: running -> stopped",
    ]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2
    for record in errors:
        text = record.getMessage()
        assert text.startswith(f"route r: AccessRefused: {refused}; this will not go away")
        delay = float(re.search(r"trying again in (\d+)s$", text).group(1))  # type: ignore[union-attr]
        assert 0.5 <= delay <= PERMANENT_RETRY_MAX
    assert runner.stats.retried == 2


async def test_failing_is_worse_than_backoff_for_the_route() -> None:
    """One loop refused, another merely waiting for a server: the route is failing."""
    transport = Transport(broker=Broker())
    route = make_route(concurrency=2)
    sources: list[Source] = [DownSource(), transport.source(route.from_.address)]

    class RefusedSink:
        async def send(
            self, envelopes: Sequence[Envelope], checkpoint: Checkpoint | None = None
        ) -> None:
            raise AccessRefused("rabbitmq connection 'r': ACCESS_REFUSED")

        async def close(self) -> None:
            return None

    await transport.sink(route.from_.address).send([message(1)])
    runner = RouteRunner(route, lambda: (sources.pop(0), RefusedSink()), poll_timeout=0.01)
    await run_until(runner, lambda: runner.stats.state == "failing" and runner.stats.retried >= 2)


async def test_poison_goes_to_the_error_queue_and_the_route_goes_on() -> None:
    transport = Transport(broker=Broker())
    route = make_route(error_queue=unique("error"))
    await transport.sink(route.from_.address).send([message(1)])
    transport.put_poison(route.from_.address, "not json", b"raw")
    await transport.sink(route.from_.address).send([message(2)])
    runner = runner_for(route, transport)
    dst = transport.broker.queue(route.to.address)
    await run_until(runner, lambda: len(dst) == 2)
    (dead,) = transport.broker.queue(route.error_queue_name)
    assert isinstance(dead, Envelope) and dead.body == b"raw"
    assert dead.headers.get("NServiceBus.Bridge.RawHeaders") == "not json"
    assert dead.headers.get("NServiceBus.FailedQ") == route.from_.address
    assert runner.stats.poison == 1


async def test_concurrent_loops_forward_each_message_once() -> None:
    transport = Transport(broker=Broker())
    route = make_route(batch_size=5, concurrency=4)
    await transport.sink(route.from_.address).send([message(i) for i in range(200)])
    runner = runner_for(route, transport)
    dst = transport.broker.queue(route.to.address)
    await run_until(runner, lambda: len(dst) == 200)
    assert sorted(e.body for e in dst) == sorted(f"body-{i}".encode() for i in range(200))  # type: ignore[union-attr]


async def test_checkpoint_travels_with_the_batch() -> None:
    broker = Broker()
    transport = Transport(broker=broker)
    sink = transport.sink("dst")
    await sink.send([message(1)], {"g/t/0": 5})
    assert await sink.load_checkpoint("g/t/") == {"g/t/0": 5}
    assert isinstance(sink, MemorySink)


class RejectingSink:
    """Refuses for good every message whose body is in `refused`, like a too-large record."""

    def __init__(self, inner: Sink, refused: set[bytes], say_which: bool) -> None:
        self.inner, self.refused, self.say_which = inner, refused, say_which

    async def send(
        self, envelopes: Sequence[Envelope], checkpoint: Checkpoint | None = None
    ) -> None:
        for i, envelope in enumerate(envelopes):
            if envelope.body in self.refused:
                raise MessageRejected("record too large", i if self.say_which else None)
        await self.inner.send(envelopes, checkpoint)

    async def close(self) -> None:
        await self.inner.close()


@pytest.mark.parametrize("say_which", [True, False])
async def test_refused_messages_go_to_the_error_queue_and_the_rest_goes_on(say_which: bool) -> None:
    transport = Transport(broker=Broker())
    route = make_route(error_queue=unique("error"), batch_size=10)
    await transport.sink(route.from_.address).send([message(i) for i in range(10)])
    sink = RejectingSink(transport.sink(route.to.address), {b"body-3", b"body-7"}, say_which)
    runner = runner_for(route, transport, sink)
    dst = transport.broker.queue(route.to.address)
    await run_until(runner, lambda: len(dst) == 8)
    dead = list(transport.broker.queue(route.error_queue_name))
    assert [d.body for d in dead] == [b"body-3", b"body-7"]
    headers = dead[0].headers
    assert headers.get("NServiceBus.MessageId") == "id-3"
    assert headers.get("NServiceBus.FailedQ") == route.from_.address
    assert headers.get("NServiceBus.ExceptionInfo.ExceptionType") == "bridge.errors.MessageRejected"
    assert headers.get("NServiceBus.ExceptionInfo.Message") == "record too large"
    assert "NServiceBus.TimeOfFailure" in headers and "NServiceBus.ProcessingEndpoint" in headers
    assert not transport.broker.queue(route.from_.address)
    assert runner.stats.poison == 2 and runner.stats.forwarded == 8


class ReturningSink:
    """Takes every message but the refused ones and then names each refused one, as a RabbitMQ
    publish does whose unroutable messages came back; with `rest_accepted=False` it takes none
    (the broker nacked some)."""

    def __init__(self, inner: Sink, refused: set[bytes], rest_accepted: bool) -> None:
        self.inner, self.refused, self.rest_accepted = inner, refused, rest_accepted
        self.sent: list[int] = []

    async def send(
        self, envelopes: Sequence[Envelope], checkpoint: Checkpoint | None = None
    ) -> None:
        self.sent.append(len(envelopes))
        bad = [i for i, e in enumerate(envelopes) if e.body in self.refused]
        if not bad or self.rest_accepted:
            await self.inner.send([e for i, e in enumerate(envelopes) if i not in bad], checkpoint)
        if bad:
            rejections = [MessageRejected(f"{envelopes[i].message_id} unroutable", i) for i in bad]
            raise MessagesRejected(rejections, rest_accepted=self.rest_accepted)

    async def close(self) -> None:
        await self.inner.close()


@pytest.mark.parametrize("rest_accepted", [True, False])
async def test_every_refused_message_of_a_send_is_rejected_and_accepted_ones_not_sent_again(
    rest_accepted: bool,
) -> None:
    transport = Transport(broker=Broker())
    route = make_route(error_queue=unique("error"), batch_size=10)
    await transport.sink(route.from_.address).send([message(i) for i in range(10)])
    refused = {b"body-2", b"body-3", b"body-7"}
    sink = ReturningSink(transport.sink(route.to.address), refused, rest_accepted)
    runner = runner_for(route, transport, sink)
    await run_until(runner, lambda: runner.stats.batches == 1)
    dst = transport.broker.queue(route.to.address)
    assert [e.body for e in dst] == [  # type: ignore[union-attr]
        f"body-{i}".encode() for i in (0, 1, 4, 5, 6, 8, 9)
    ]
    assert sink.sent == ([10] if rest_accepted else [10, 7])
    dead = list(transport.broker.queue(route.error_queue_name))
    assert [d.headers.get("NServiceBus.MessageId") for d in dead] == ["id-2", "id-3", "id-7"]  # type: ignore[union-attr]
    assert [d.headers.get("NServiceBus.ExceptionInfo.Message") for d in dead] == [  # type: ignore[union-attr]
        "id-2 unroutable",
        "id-3 unroutable",
        "id-7 unroutable",
    ]
    assert runner.stats.poison == 3 and runner.stats.forwarded == 7


async def test_failed_batches_count_their_messages_as_retried() -> None:
    transport = Transport(broker=Broker())
    route = make_route(batch_size=10)
    await transport.sink(route.from_.address).send([message(i) for i in range(25)])
    sink = FlakySink(transport.sink(route.to.address), 3, TransportUnavailable("db down"))
    reader = InMemoryMetricReader()
    runner = runner_for(
        route, transport, sink, metrics=Metrics(MeterProvider(metric_readers=[reader]))
    )
    await run_until(runner, lambda: len(transport.broker.queue(route.to.address)) == 25)
    data = reader.get_metrics_data()
    assert data is not None
    values = {
        m.name: m.data.data_points[0].value
        for r in data.resource_metrics
        for s in r.scope_metrics
        for m in s.metrics
        if m.name.endswith("retried")
    }
    assert values == {"bridge_batches_retried": 3, "bridge_messages_retried": 30}
    assert runner.stats.retried == 3 and runner.stats.retried_messages == 30


async def test_not_running_until_the_probe_reaches_both_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An empty source and a sink that connects at its first send: only the probe can tell."""
    transport = Transport(broker=Broker())
    route = make_route()
    probes: list[int] = []

    async def probe() -> None:
        probes.append(1)
        if len(probes) <= 3:
            raise TransportUnavailable("destination unreachable at 127.0.0.1:1")

    runner = runner_for(route, transport, probe=probe)
    seen: set[str] = set()

    def done() -> bool:
        seen.add(runner.stats.state)
        if len(probes) <= 3:
            assert runner.stats.state in ("starting", "backoff")
        return runner.stats.state == "running"

    with caplog.at_level(logging.INFO, logger="bridge.route"):
        await run_until(runner, done)
    assert "backoff" in seen
    assert len(probes) == 4  # at the start and after each backoff, not per receive
    assert runner.stats.last_error == "TransportUnavailable: destination unreachable at 127.0.0.1:1"
    assert runner.stats.retried == 3 and runner.stats.retried_messages == 0
    assert state_changes(caplog) == [
        "route r: starting -> backoff",
        "route r: backoff -> running",
        "route r: running -> stopped",
    ]


class DownSource:
    """A source whose database is gone: every receive fails, as a lost connection's would."""

    def __init__(self) -> None:
        self.calls = 0

    async def receive_batch(self, max_messages: int, timeout: float) -> Batch:
        self.calls += 1
        raise TransportUnavailable("source down")

    async def close(self) -> None:
        return None


async def test_one_loop_in_backoff_keeps_the_route_in_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another loop's empty receives must not make the route look running (/readyz flaps)."""
    transport = Transport(broker=Broker())
    route = make_route(concurrency=2)
    down = DownSource()
    polled: list[int] = []
    healthy = transport.source(route.from_.address)

    class CountingSource:
        async def receive_batch(self, max_messages: int, timeout: float) -> Batch:
            polled.append(1)
            return await healthy.receive_batch(max_messages, timeout)

        async def close(self) -> None:
            await healthy.close()

    opened: list[Source] = [down, CountingSource()]

    def endpoints() -> tuple[Source, Sink]:
        return opened.pop(0), transport.sink(route.to.address)

    runner = RouteRunner(route, endpoints, poll_timeout=0.01)

    def done() -> bool:
        if down.calls:
            assert runner.stats.state == "backoff"
        return down.calls >= 3 and len(polled) >= 20

    with caplog.at_level(logging.INFO, logger="bridge.route"):
        await run_until(runner, done)
    assert state_changes(caplog) == ["route r: starting -> backoff", "route r: backoff -> stopped"]


async def test_forwarding_logs_no_line_per_message(caplog: pytest.LogCaptureFixture) -> None:
    transport = Transport(broker=Broker())
    route = make_route(batch_size=5)
    await transport.sink(route.from_.address).send([message(i) for i in range(50)])
    runner = runner_for(route, transport)
    dst = transport.broker.queue(route.to.address)
    with caplog.at_level(logging.DEBUG):
        await run_until(runner, lambda: len(dst) == 50)
    info = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert [r.getMessage() for r in info] == [
        "route r: starting -> running",
        "route r: running -> stopped",
    ]
    assert not any("id-" in r.getMessage() for r in caplog.records)  # no message ids, any level
    # structured: the route and its new state are fields of the JSON line
    line = json.loads(JsonFormatter().format(info[0]))
    assert line["route"] == "r" and line["state"] == "running"


async def test_one_warning_per_batch_sent_to_the_error_queue(
    caplog: pytest.LogCaptureFixture,
) -> None:
    transport = Transport(broker=Broker())
    route = make_route(error_queue=unique("error"), batch_size=10)
    for _ in range(3):
        transport.put_poison(route.from_.address, "not json", b"raw")
    await transport.sink(route.from_.address).send([message(i) for i in range(10)])
    sink = RejectingSink(transport.sink(route.to.address), {b"body-3", b"body-7"}, True)
    runner = runner_for(route, transport, sink)
    dst = transport.broker.queue(route.to.address)
    with caplog.at_level(logging.INFO, logger="bridge.route"):
        await run_until(runner, lambda: len(dst) == 8)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    # the receive took 3 poison and 7 messages, then the last 3: two batches, two lines
    assert [r.getMessage() for r in warnings] == [
        f"route r: 4 message(s) moved to error queue {route.error_queue_name} "
        "on connection a: unreadable headers",
        f"route r: 1 message(s) moved to error queue {route.error_queue_name} "
        "on connection a: record too large",
    ]
    line = json.loads(JsonFormatter().format(warnings[0]))
    assert line["route"] == "r" and line["error_queue"] == route.error_queue_name
    assert line["failed"] == 4 and line["level"] == "warning"
