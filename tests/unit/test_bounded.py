"""Memory stays flat over a long run against a slow destination: nothing piles up."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Sequence

from bridge.batch import Batch
from bridge.config.models import Route
from bridge.envelope import Envelope, Headers
from bridge.protocols import Checkpoint, Sink, Source
from bridge.routing.runner import RouteRunner

BATCH = 100


class EndlessSource:
    """A source that always has a full batch of fresh 1 KB messages waiting."""

    def __init__(self) -> None:
        self.batches = 0

    async def receive_batch(self, max_messages: int, timeout: float) -> Batch:
        self.batches += 1
        messages = [
            Envelope(
                Headers([("NServiceBus.MessageId", f"{self.batches}-{i}"), ("k", "v" * 50)]),
                b"x" * 1024,
            )
            for i in range(max_messages)
        ]
        return Batch(messages)

    async def close(self) -> None:
        return None


class SlowSink:
    """Accepts everything, slowly: a destination that is the bottleneck."""

    def __init__(self) -> None:
        self.sent = 0

    async def send(
        self, envelopes: Sequence[Envelope], checkpoint: Checkpoint | None = None
    ) -> None:
        await asyncio.sleep(0.001)
        self.sent += len(envelopes)

    async def close(self) -> None:
        return None


async def test_memory_is_flat_against_a_slow_destination() -> None:
    route = Route.model_validate(
        {
            "name": "long-run",
            "from": {"connection": "a", "queue": "in"},
            "to": {"connection": "b", "queue": "out"},
            "batch_size": BATCH,
            "concurrency": 2,
        }
    )
    source, sink = EndlessSource(), SlowSink()
    endpoints: list[tuple[Source, Sink]] = [(source, sink), (source, sink)]
    runner = RouteRunner(route, endpoints.pop, poll_timeout=0.05)
    task = asyncio.create_task(runner.run())

    async def until(batches: int) -> int:
        while runner.stats.batches < batches:  # noqa: ASYNC110 - counters, no event to await
            await asyncio.sleep(0.01)
        gc.collect()
        return tracemalloc.get_traced_memory()[0]

    tracemalloc.start()
    try:
        warm = await until(300)
        end = await until(3000)
    finally:
        tracemalloc.stop()
        runner.stop()
        await task
    in_flight = 2 * BATCH * 1200  # two loops, one batch each, about 1.2 KB per message
    assert source.batches - runner.stats.batches <= 2  # never more received than settled
    assert end - warm < in_flight, f"grew {end - warm} bytes over 2,700 batches"
    assert sink.sent == runner.stats.forwarded >= 3000 * BATCH
