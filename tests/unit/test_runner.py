"""The route runner on the in-memory transport: what leaves the source, and when."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest

from bridge.config.models import Route
from bridge.envelope import Envelope, Headers
from bridge.errors import MessageRejected, TransportError, TransportUnavailable
from bridge.protocols import Checkpoint, Sink, Source
from bridge.routing.runner import RouteRunner
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


def runner_for(route: Route, transport: Transport, sink: Sink | None = None) -> RouteRunner:
    def endpoints() -> tuple[Source, Sink]:
        source = transport.source(route.from_.address, error_queue=route.error_queue_name)
        return source, sink or transport.sink(route.to.address)

    return RouteRunner(route, endpoints, poll_timeout=0.05)


async def test_forwards_everything_in_order_and_empties_the_source() -> None:
    transport = Transport(broker=Broker())
    route = make_route(batch_size=7)
    await transport.sink(route.from_.address).send([message(i) for i in range(50)])
    runner = runner_for(route, transport)
    dst = transport.broker.queue(route.to.address)
    await run_until(runner, lambda: len(dst) == 50)
    assert [e.body for e in dst] == [f"body-{i}".encode() for i in range(50)]  # type: ignore[union-attr]
    assert not transport.broker.queue(route.from_.address)
    assert runner.stats.forwarded == 50 and runner.stats.batches == 8
    assert runner.stats.state == "stopped"


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


async def test_failing_destination_keeps_messages_at_source_until_it_recovers() -> None:
    transport = Transport(broker=Broker())
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
    assert dead.raw_headers == "not json" and dead.body == b"raw"  # type: ignore[union-attr]
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
