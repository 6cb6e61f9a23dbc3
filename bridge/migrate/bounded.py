"""A route run by its own `RouteRunner` until a bounded source is exhausted: what one Spark
task does with its range.

The runner is the service's, with one loop (Spark provides the parallelism): it drops expired
messages, applies the route's `RouteRules`, sends, rejects what the destination refuses for
good, and commits the source only after the send returned. The source here is bounded (a SQL
sequence range, a Kafka partition's offset range): the first receive that comes back empty
ends the run.

Failures end the task rather than spin in it: an error that will not go away stops the run at
once (`stop_on_fatal`), and one that may go away is retried with the runner's backoff for up
to `give_up_after` seconds. Either way the batch in hand is aborted, so it stays at the source,
and the exception leaves the task for Spark to retry it (`spark.task.maxFailures`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from bridge.config.models import Route
from bridge.envelope import Envelope
from bridge.errors import BridgeError, TransportUnavailable
from bridge.protocols import Checkpoint, ReceivedBatch, Sink, Source
from bridge.routing.rules import RouteRules
from bridge.routing.runner import RouteRunner
from bridge.telemetry.metrics import Metrics

__all__ = ["TASK_FAILED", "InjectedFailure", "Moved", "run_task", "run_until_exhausted"]

#: How often the task looks at its runner.
_WATCH_EVERY = 0.2


@dataclass
class Moved:
    """What one task did (`attempt`: Spark's attempt number, 0 for the first); sums of them
    add the counts only."""

    moved: int = 0
    expired: int = 0
    poison: int = 0
    batches: int = 0
    retried: int = 0
    attempt: int = 0

    def __add__(self, other: Moved) -> Moved:
        return Moved(
            self.moved + other.moved,
            self.expired + other.expired,
            self.poison + other.poison,
            self.batches + other.batches,
            self.retried + other.retried,
        )


class InjectedFailure(BridgeError):
    """The test hook's failure (`spec.FAIL_AFTER_ENV`); never retried within the task."""


class _UntilEmpty:
    """The bounded source; its first empty receive stops the runner."""

    def __init__(self, source: Source) -> None:
        self._source = source
        self.runner: RouteRunner | None = None
        self.exhausted = False

    async def receive_batch(self, max_messages: int, timeout: float) -> ReceivedBatch:
        batch = await self._source.receive_batch(max_messages, timeout)
        if not (batch.messages or batch.poison or batch.expired):
            self.exhausted = True
            if self.runner is not None:
                self.runner.stop()
        return batch

    async def close(self) -> None:
        await self._source.close()


class _FailAfter:
    """The sink, failing right after its `sends`-th send returned (before the commit)."""

    def __init__(self, sink: Sink, sends: int) -> None:
        self._sink = sink
        self._left = sends

    async def send(
        self, envelopes: Sequence[Envelope], checkpoint: Checkpoint | None = None
    ) -> None:
        await self._sink.send(envelopes, checkpoint)
        self._left -= 1
        if self._left <= 0:
            raise InjectedFailure("injected failure after a send, before its commit (test hook)")

    async def close(self) -> None:
        await self._sink.close()


async def run_until_exhausted(
    route: Route,
    source: Source,
    sink: Sink,
    *,
    give_up_after: float = 60.0,
    fail_after: int | None = None,
    rules: RouteRules | None = None,
) -> Moved:
    """Move everything `source` holds to `sink` the way the route's service loop would, with
    the route's `rules` (for a route the registry derives: its address translation)."""
    bounded = _UntilEmpty(source)
    out: Sink = sink if fail_after is None else _FailAfter(sink, fail_after)
    runner = RouteRunner(
        route.model_copy(update={"concurrency": 1}),
        lambda: (bounded, out),
        poll_timeout=0.0,
        stop_on_fatal=True,
        metrics=Metrics().for_route(route.name),
        rules=rules,
    )
    bounded.runner = runner
    running = asyncio.create_task(runner.run())
    backoff_since: float | None = None
    gave_up = False
    while not running.done():
        await asyncio.wait({running}, timeout=_WATCH_EVERY)
        if runner.stats.state != "backoff":
            backoff_since = None
        elif backoff_since is None:
            backoff_since = time.monotonic()
        elif time.monotonic() - backoff_since > give_up_after:
            gave_up = True
            runner.stop()
    await running
    if runner.fatal is not None:
        raise runner.fatal
    if gave_up or not bounded.exhausted:
        raise TransportUnavailable(
            f"route {route.name}: gave up after {give_up_after:.0f} s of retrying: "
            f"{runner.stats.last_error}"
        )
    stats = runner.stats
    return Moved(stats.forwarded, stats.expired, stats.poison, stats.batches, stats.retried)


#: Prefix of the one line a failed task leaves in the driver's exception text.
TASK_FAILED = "bridge task failed: "


def run_task(
    spec_fail_after: int | None,
    index: int,
    work: Callable[[int | None], Coroutine[Any, Any, Moved]],
) -> Moved:
    """Run one task's coroutine in the Spark worker; called by the task functions.

    The test hook (`spec.FAIL_AFTER_ENV`) applies to the first attempt of task 0 only. An
    exception leaves as one `TASK_FAILED` line without a chain, which the driver shows.
    """
    from pyspark import TaskContext

    context = TaskContext.get()
    attempt = context.attemptNumber() if context is not None else 0
    fail_after = spec_fail_after if index == 0 and attempt == 0 else None
    try:
        moved = asyncio.run(work(fail_after))
    except Exception as exc:
        raise RuntimeError(f"{TASK_FAILED}{type(exc).__name__}: {exc}") from None
    moved.attempt = attempt
    return moved
