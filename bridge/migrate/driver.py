"""`bridge migrate`: plan a route's backlog, move it with Spark tasks, report progress and sum up.

The plan (`plans`: which ranges, how progress is measured) depends on the route's source: a
SQL queue table goes to anything, a Kafka topic only into a SQL queue table; other routes are
config errors (`bridge run --until-idle` moves them). The driver checks the route's tables and
topics exist before Spark starts, and an empty backlog ends there without starting it.

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
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from bridge.config.models import BridgeConfig
from bridge.errors import BridgeError, ConfigError
from bridge.migrate.bounded import TASK_FAILED, Moved
from bridge.migrate.plans import Plan, plan_for
from bridge.migrate.session import spark_session
from bridge.migrate.spec import JobSpec

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
    plan = plan_for(config, route)
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
    summary.moved = sum(results, Moved())
    summary.tasks = len(results)
    summary.retried_tasks = sum(1 for r in results if r.attempt > 0)
    return summary


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
