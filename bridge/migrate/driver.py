"""`bridge migrate`: plan a route's backlog, move it with Spark tasks, report progress and sum up.

Plans
    SQL queue table -> anything: the driver reads the table's lowest and highest sequence
    number and splits that into `partitions` ranges (default 4 x Spark's default parallelism,
    so uneven ranges even out); one task per range (`sqltask`). Rows inserted after planning
    (above the highest) are the service's. Progress: rows of the planned range still in the
    table.

    Kafka topic -> SQL queue table: per partition, from the position stored with the rows in
    the destination's `BridgeCheckpoints` (the service's names, `group/topic/partition`), else
    the earliest offset, up to the end offset at planning time; one task per partition
    (`kafkatask`); `partitions` does not apply. Progress: the stored positions.

    Other routes are config errors: `bridge run --until-idle` moves them.

Before Spark starts, the driver checks the route's tables/topics exist (as `bridge check
--connect` would); an empty backlog ends there without starting Spark.

Failures
    A task that fails is retried by Spark (`spark.task.maxFailures`; in local mode give the
    retries in the master URL, `local[*,4]`). When a task fails for good the job is cancelled
    and `MigrationFailed` carries the task's own one-line error. Counts in the summary are
    those of the successful task attempts; what a failed attempt committed before failing is
    moved but not counted, and the summary says when that happened.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from bridge.config.models import SQL_TYPES, BridgeConfig, Route
from bridge.errors import BridgeError, ConfigError
from bridge.migrate.bounded import TASK_FAILED, Moved
from bridge.migrate.ranges import split
from bridge.migrate.session import spark_session
from bridge.migrate.spec import JobSpec
from bridge.protocols import Transport
from bridge.transports import load

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext

__all__ = ["MigrationFailed", "Summary", "migrate"]

log = logging.getLogger("bridge.migrate")

_TASK_ERROR = re.compile(re.escape(TASK_FAILED) + r"(.*)")


class MigrationFailed(BridgeError):
    """A task failed for good (after Spark's retries), or Spark could not run the job."""


@dataclass
class Summary:
    route: str
    source: str
    destination: str
    planned: int = 0
    moved: Moved = field(default_factory=Moved)
    seconds: float = 0.0
    startup_seconds: float = 0.0
    tasks: int = 0
    retried_tasks: int = 0

    @property
    def rate(self) -> float:
        return self.moved.moved / self.seconds if self.seconds > 0 else 0.0

    def describe(self) -> str:
        lines = [
            f"migrated route {self.route} ({self.source} -> {self.destination})",
            f"  planned  {self.planned}",
            f"  moved    {self.moved.moved}",
            f"  expired  {self.moved.expired}",
            f"  poison   {self.moved.poison}",
            f"  seconds  {self.seconds:.1f} (plus {self.startup_seconds:.1f} s to start Spark)",
            f"  rate     {self.rate:.0f} msg/s",
            f"  tasks    {self.tasks}",
        ]
        if self.retried_tasks:
            lines[-1] += (
                f" ({self.retried_tasks} retried: what their failed attempts committed is moved "
                "but not counted above)"
            )
        return "\n".join(lines)


class _Plan:
    """What differs between the two kinds of route (see the module docstring)."""

    #: The Spark task function, called with (spec, item).
    task: Callable[[JobSpec, Any], Moved]
    planned: int = 0

    async def check(self) -> None:
        raise NotImplementedError

    def items(self, partitions: int) -> list[Any]:
        raise NotImplementedError

    async def done(self) -> int:
        """How many of `planned` have left the source so far."""
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class _SqlPlan(_Plan):
    def __init__(self, config: BridgeConfig, route: Route) -> None:
        from bridge.migrate.sqltask import sql_task
        from bridge.transports.sql.queue import SqlTransport

        self.task = sql_task
        self._route = route
        source = load(route.from_.connection, config.connections[route.from_.connection])
        assert isinstance(source, SqlTransport)
        self._source = source
        self._sink: Transport | None = None
        if route.to.connection != route.from_.connection:
            self._sink = load(route.to.connection, config.connections[route.to.connection])
        self._bounds: tuple[int, int] | None = None

    async def check(self) -> None:
        route = self._route
        if self._sink is None:
            await self._source.check(
                [route.from_.address, route.error_queue_name, route.to.address]
            )
        else:
            await self._source.check([route.from_.address, route.error_queue_name])
            await self._sink.check([route.to.address])
        self._bounds = await self._source.bounds(route.from_.address)
        if self._bounds is not None:
            self.planned = await self._source.count_range(route.from_.address, *self._bounds)

    def items(self, partitions: int) -> list[tuple[int, int, int]]:
        if self._bounds is None:
            return []
        return [(i, lo, hi) for i, (lo, hi) in enumerate(split(*self._bounds, partitions))]

    async def done(self) -> int:
        if self._bounds is None:
            return 0
        left = await self._source.count_range(self._route.from_.address, *self._bounds)
        return self.planned - left

    async def close(self) -> None:
        await self._source.close()
        if self._sink is not None:
            await self._sink.close()


class _KafkaPlan(_Plan):
    def __init__(self, config: BridgeConfig, route: Route) -> None:
        from bridge.migrate.kafkatask import kafka_task
        from bridge.transports.kafka import Transport as KafkaTransport
        from bridge.transports.sql.queue import SqlSink

        self.task = kafka_task
        self._route = route
        kafka = load(route.from_.connection, config.connections[route.from_.connection])
        assert isinstance(kafka, KafkaTransport)
        self._kafka = kafka
        self._sql = load(route.to.connection, config.connections[route.to.connection])
        sink = self._sql.sink(route.to.address)
        assert isinstance(sink, SqlSink)
        self._sink = sink
        self._prefix = f"{route.from_.group}/{route.from_.address}/"
        self._ranges: list[tuple[int, int, int]] = []

    async def check(self) -> None:
        from bridge.migrate.kafkatask import partition_offsets

        route = self._route
        await self._kafka.check([route.from_.address, route.error_queue_name])
        await self._sql.check([route.to.address])
        offsets = await partition_offsets(self._kafka.config, route.from_.address)
        stored = await self._sink.load_checkpoint(self._prefix)
        for partition, (begin, end) in sorted(offsets.items()):
            start = max(begin, stored.get(f"{self._prefix}{partition}", begin))
            if start < end:
                self._ranges.append((partition, start, end))
        self.planned = sum(end - start for _, start, end in self._ranges)

    def items(self, partitions: int) -> list[tuple[int, int, int, int]]:
        return [(i, *r) for i, r in enumerate(self._ranges)]

    async def done(self) -> int:
        stored = await self._sink.load_checkpoint(self._prefix)
        return sum(
            min(max(stored.get(f"{self._prefix}{p}", start), start), end) - start
            for p, start, end in self._ranges
        )

    async def close(self) -> None:
        await self._sink.close()
        await self._kafka.close()
        await self._sql.close()


def _plan(config: BridgeConfig, route: Route) -> _Plan:
    kinds = (
        config.connections[route.from_.connection].type,
        config.connections[route.to.connection].type,
    )
    if kinds[0] in SQL_TYPES:
        return _SqlPlan(config, route)
    if kinds[0] == "kafka" and kinds[1] in SQL_TYPES:
        return _KafkaPlan(config, route)
    raise ConfigError(
        f"route {route.name} goes {kinds[0]} -> {kinds[1]}: bridge migrate moves routes from a "
        "SQL queue table, and from a Kafka topic into a SQL queue table; "
        "`bridge run --until-idle` moves the others"
    )


async def migrate(
    spec: JobSpec,
    *,
    master: str | None,
    partitions: int | None = None,
    progress_every: float = 5.0,
) -> Summary:
    """Run the migration of `spec`'s route; raise MigrationFailed when a task failed for good."""
    if partitions is not None and partitions < 1:
        raise ConfigError("--partitions must be at least 1")
    config, route = spec.load()
    summary = Summary(
        route.name,
        _where(config, route.from_.connection, route.from_.address),
        _where(config, route.to.connection, route.to.address),
    )
    plan = _plan(config, route)
    try:
        await plan.check()
        summary.planned = plan.planned
        if not plan.planned:
            log.info("route %s: nothing to move", route.name)
            return summary
        began = time.monotonic()
        with spark_session(f"bridge migrate {route.name}", master) as spark:
            sc = spark.sparkContext
            items = plan.items(partitions or 4 * sc.defaultParallelism)
            summary.startup_seconds = time.monotonic() - began
            log.info(
                "route %s: moving %d messages in %d tasks on %s",
                route.name,
                plan.planned,
                len(items),
                sc.master,
            )
            rdd = sc.parallelize(items, len(items)).map(partial(plan.task, spec))
            started = time.monotonic()
            results = await _collect(sc, rdd, plan, route.name, progress_every)
            summary.seconds = time.monotonic() - started
    finally:
        await plan.close()
    for result in results:
        summary.moved += result
    summary.moved.attempt = 0
    summary.tasks = len(results)
    summary.retried_tasks = sum(1 for r in results if r.attempt > 0)
    return summary


async def _collect(
    sc: SparkContext, rdd: RDD[Moved], plan: _Plan, route: str, every: float
) -> list[Moved]:
    """Run the job in a thread; log progress every `every` seconds until it ends."""
    group = f"bridge-migrate-{uuid.uuid4().hex[:12]}"

    def collect() -> list[Moved]:
        sc.setJobGroup(group, f"bridge migrate {route}", interruptOnCancel=False)
        return rdd.collect()

    started = time.monotonic()
    job = asyncio.ensure_future(asyncio.to_thread(collect))
    try:
        while True:
            finished, _ = await asyncio.wait({job}, timeout=every)
            if finished:
                break
            await _progress(sc, group, plan, route, time.monotonic() - started)
        return job.result()
    except asyncio.CancelledError:
        sc.cancelJobGroup(group)
        raise
    except Exception as exc:
        raise MigrationFailed(f"route {route}: {_task_error(exc)}") from None


async def _progress(sc: SparkContext, group: str, plan: _Plan, route: str, elapsed: float) -> None:
    try:
        done = await plan.done()
    except Exception as exc:  # progress is best effort; the job goes on
        log.debug("progress of %s unavailable: %s", route, exc)
        return
    tracker = sc.statusTracker()
    finished = tasks = 0
    for job_id in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job_id)
        for stage_id in info.stageIds if info is not None else ():
            stage = tracker.getStageInfo(stage_id)
            if stage is not None:
                finished += stage.numCompletedTasks
                tasks += stage.numTasks
    share = 100 * done / plan.planned if plan.planned else 100.0
    log.info(
        "route %s: %d/%d moved (%.0f%%), %.0f msg/s, tasks %d/%d finished",
        route,
        done,
        plan.planned,
        share,
        done / elapsed if elapsed > 0 else 0.0,
        finished,
        tasks,
    )


def _task_error(exc: BaseException) -> str:
    found = _TASK_ERROR.findall(str(exc))
    if found:
        return str(found[-1]).strip()
    first = next((line for line in str(exc).splitlines() if line.strip()), "")
    return f"the Spark job failed: {type(exc).__name__}: {first}"


def _where(config: BridgeConfig, connection: str, address: str) -> str:
    return f"{config.connections[connection].type} {connection}/{address}"
