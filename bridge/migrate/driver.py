"""`bridge migrate`: plan a route's backlog, move it with Spark tasks, report progress and sum up.

The plan (`plans`: which ranges, how progress is measured) depends on the route's source: a
SQL queue table goes to anything, a Kafka topic only into a SQL queue table; other routes are
config errors (`bridge run --until-idle` moves them). The driver checks the master URL's form,
and the route's tables and topics exist, before Spark starts; an empty backlog ends there
without starting it.

Summary
    `moved` is what left the source, read from the source once the job ended (`Plan.done`:
    rows of the planned SQL range no longer in the table, or Kafka offsets stored with the
    rows), less the expired and poison messages the finished task attempts counted. So a
    retried task's first attempt counts with what it committed, and rows that stayed (held by
    another transaction's lock, or not reached before a failure) are `left`, with a warning.
    Rows the service received from the planned range next to the job count as moved.

Failures
    A task that fails is retried by Spark (`spark.task.maxFailures`; in local mode give the
    retries in the master URL, `local[*,4]`). When a task fails for good the job is cancelled
    and `MigrationFailed` carries the task's own one-line error and the summary of how far the
    job got.
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

from bridge.config.models import BridgeConfig
from bridge.errors import BridgeError, ConfigError
from bridge.migrate.bounded import TASK_FAILED, Moved
from bridge.migrate.plans import Plan, plan_for
from bridge.migrate.session import check_master, spark_session
from bridge.migrate.spec import JobSpec
from bridge.telemetry.redact import redactor

if TYPE_CHECKING:
    from pyspark import RDD, Accumulator, SparkContext

__all__ = ["MigrationFailed", "Summary", "migrate"]

log = logging.getLogger("bridge.migrate")

_TASK_ERROR = re.compile(re.escape(TASK_FAILED) + r"(.*)")


class MigrationFailed(BridgeError):
    """A task failed for good (after Spark's retries), or Spark could not run the job;
    `summary` says how far it got (None when it failed before moving anything)."""

    def __init__(self, message: str, summary: Summary | None = None) -> None:
        super().__init__(message)
        self.summary = summary


@dataclass
class Summary:
    """What the job did; `moved.moved` and `left` are read from the source (module docstring),
    `moved.expired` and `moved.poison` are the finished task attempts' counts."""

    route: str
    source: str
    destination: str
    planned: int = 0
    moved: Moved = field(default_factory=Moved)
    left: int | None = 0
    seconds: float = 0.0
    startup_seconds: float = 0.0
    tasks: int = 0
    finished_tasks: int = 0
    retried_tasks: int = 0
    failed: bool = False
    unread: str = ""

    @property
    def rate(self) -> float:
        return self.moved.moved / self.seconds if self.seconds > 0 else 0.0

    def describe(self) -> str:
        outcome = "stopped migrating" if self.failed else "migrated"
        lines = [
            f"{outcome} route {self.route} ({self.source} -> {self.destination})",
            f"  planned  {self.planned}",
            f"  moved    {self.moved.moved}",
            f"  expired  {self.moved.expired}",
            f"  poison   {self.moved.poison}",
            f"  left     {'unknown' if self.left is None else self.left}",
            f"  seconds  {self.seconds:.1f} (plus {self.startup_seconds:.1f} s to start Spark)",
            f"  rate     {self.rate:.0f} msg/s",
            f"  tasks    {self.finished_tasks}"
            + (f" of {self.tasks} finished" if self.finished_tasks < self.tasks else ""),
        ]
        if self.retried_tasks:
            lines[-1] += (
                f" ({self.retried_tasks} retried: a retry may deliver again the one batch its "
                "failed attempt had in flight)"
            )
        if self.left is None:
            lines.append(
                f"warning: what is left in the source could not be read ({self.unread}); "
                "moved counts the finished tasks only"
            )
        elif self.left:
            lines.append(
                f"warning: {self.left} of the {self.planned} planned messages are still in "
                "the source (held by another transaction, or not reached); run the migration "
                "again or leave them to the service"
            )
        return "\n".join(lines)


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
    check_master(master)
    config, route = spec.load()
    summary = Summary(
        route.name,
        _where(config, route.from_.connection, route.from_.address),
        _where(config, route.to.connection, route.to.address),
    )
    plan = plan_for(config, route)
    failure: MigrationFailed | None = None
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
            summary.tasks = len(items)
            log.info(
                "route %s: moving %d messages in %d tasks on %s",
                route.name,
                plan.planned,
                len(items),
                sc.master,
            )
            finished = _finished_tasks(sc)
            rdd = sc.parallelize(items, len(items)).map(
                partial(_run_task, plan.task, spec, finished)
            )
            started = time.monotonic()
            try:
                await _collect(sc, rdd, plan, route.name, progress_every)
            except MigrationFailed as exc:
                failure = exc
            summary.seconds = time.monotonic() - started
            results: list[Moved] = list(finished.value)
        await _sum_up(summary, plan, results)
    finally:
        await plan.close()
    if failure is not None:
        summary.failed = True
        failure.summary = summary
        raise failure
    return summary


async def _sum_up(summary: Summary, plan: Plan, results: list[Moved]) -> None:
    """Fill `summary` from the finished task attempts and what left the source."""
    counted = sum(results, Moved())
    summary.finished_tasks = len(results)
    summary.retried_tasks = sum(1 for r in results if r.attempt > 0)
    moved = counted.moved
    try:
        done = await plan.done()
    except Exception as exc:  # the counts of the finished tasks are all there is
        first = next(iter(str(exc).splitlines()), "") or type(exc).__name__
        summary.left, summary.unread = None, redactor(first)
    else:
        summary.left = plan.planned - done
        moved = max(0, done - counted.expired - counted.poison)
    summary.moved = Moved(moved, counted.expired, counted.poison, counted.batches, counted.retried)


def _run_task(
    task: Callable[[JobSpec, Any], Moved],
    spec: JobSpec,
    finished: Accumulator[list[Moved]],
    item: Any,
) -> Moved:
    """The Spark task: `task` over `item`, its counts added to `finished` (Spark applies the
    update of a successful attempt only, even when the job fails later)."""
    moved = task(spec, item)
    finished.add([moved])
    return moved


def _finished_tasks(sc: SparkContext) -> Accumulator[list[Moved]]:
    from pyspark.accumulators import AccumulatorParam

    class Appended(AccumulatorParam[list[Moved]]):
        def zero(self, value: list[Moved]) -> list[Moved]:
            return []

        def addInPlace(self, value1: list[Moved], value2: list[Moved]) -> list[Moved]:
            return value1 + value2

    return sc.accumulator([], Appended())


async def _collect(
    sc: SparkContext, rdd: RDD[Moved], plan: Plan, route: str, every: float
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


async def _progress(sc: SparkContext, group: str, plan: Plan, route: str, elapsed: float) -> None:
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
