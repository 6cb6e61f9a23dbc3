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

Progress and Ctrl-C (`progress`)
    On a terminal a status line shows Spark starting, then moved/planned, rate, time left and
    Spark's stage and tasks; elsewhere an INFO line every `progress_every` seconds. Ctrl-C
    cancels the job and raises `MigrationInterrupted` with the summary of what moved.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from bridge.config.models import BridgeConfig
from bridge.errors import BridgeError, ConfigError
from bridge.migrate.bounded import TASK_FAILED, Moved
from bridge.migrate.plans import Plan, plan_for
from bridge.migrate.progress import (
    Interrupted,
    StatusLine,
    describe_stages,
    duration,
    interruptible,
    job_group,
    stages_of,
)
from bridge.migrate.session import check_master, spark_session
from bridge.migrate.spec import JobSpec
from bridge.telemetry.redact import redactor

if TYPE_CHECKING:
    from pyspark import Accumulator, SparkContext

__all__ = ["MigrationFailed", "MigrationInterrupted", "Summary", "migrate"]

log = logging.getLogger("bridge.migrate")

_TASK_ERROR = re.compile(re.escape(TASK_FAILED) + r"(.*)")


class MigrationFailed(BridgeError):
    """A task failed for good (after Spark's retries), or Spark could not run the job;
    `summary` says how far it got (None when it failed before moving anything)."""

    def __init__(self, message: str, summary: Summary | None = None) -> None:
        super().__init__(message)
        self.summary = summary


class MigrationInterrupted(Interrupted):
    """Ctrl-C cancelled the job; `summary` says what moved before it stopped."""

    def __init__(self, summary: Summary) -> None:
        left = "unknown" if summary.left is None else f"{summary.left:,}"
        super().__init__(
            f"interrupted: {summary.moved.moved:,} of {summary.planned:,} messages moved, "
            f"{left} left in the source; run it again to move the rest"
        )
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
    interrupted: bool = False
    unread: str = ""

    @property
    def rate(self) -> float:
        return self.moved.moved / self.seconds if self.seconds > 0 else 0.0

    def describe(self) -> str:
        outcome = (
            "interrupted migrating"
            if self.interrupted
            else "stopped migrating"
            if self.failed
            else "migrated"
        )
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
    status: StatusLine | None = None,
) -> Summary:
    """Run the migration of `spec`'s route; raise MigrationFailed when a task failed for good,
    MigrationInterrupted on Ctrl-C. `status`: the terminal's status line (default: stderr's)."""
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
    interrupted = False
    line = status if status is not None else StatusLine()
    try:
        await plan.check()
        summary.planned = plan.planned
        if not plan.planned:
            log.info("route %s: nothing to move", route.name)
            return summary
        began = time.monotonic()
        line.starting(f"route {route.name}", master, began)
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
            watch = _Watch(sc, job_group(), plan, route.name, logs=not line.enabled)
            line.show(watch.render)
            started = time.monotonic()
            try:
                await interruptible(
                    sc,
                    watch.group,
                    f"bridge migrate {route.name}",
                    rdd.collect,
                    every=1.0 if line.enabled else progress_every,
                    tick=watch.tick,
                )
            except Interrupted:
                interrupted = True
            except Exception as exc:
                failure = MigrationFailed(f"route {route.name}: {_task_error(exc)}")
            finally:
                line.close()  # before Spark stops: the line reads its status tracker
            summary.seconds = time.monotonic() - started
            results: list[Moved] = list(finished.value)
        await _sum_up(summary, plan, results)
    finally:
        line.close()
        await plan.close()
    if interrupted:
        summary.interrupted = True
        raise MigrationInterrupted(summary)
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


class _Watch:
    """How far the job is: `tick` reads what left the source (every second on a terminal,
    logging it elsewhere), `render` makes the status line with Spark's stages."""

    def __init__(self, sc: SparkContext, group: str, plan: Plan, route: str, *, logs: bool):
        self.sc, self.group, self.plan, self.route, self.logs = sc, group, plan, route, logs
        self.done = 0
        self.started = time.monotonic()

    async def tick(self, elapsed: float) -> None:
        try:
            self.done = await self.plan.done()
        except Exception as exc:  # progress is best effort; the job goes on
            log.debug("progress of %s unavailable: %s", self.route, exc)
            return
        if self.logs:
            stages = stages_of(self.sc, self.group)
            log.info(
                "route %s: %d/%d moved (%.0f%%), %.0f msg/s, tasks %d/%d finished",
                self.route,
                self.done,
                self.plan.planned,
                self._share(),
                self.done / elapsed if elapsed > 0 else 0.0,
                stages.finished,
                stages.tasks,
            )

    def render(self) -> str:
        elapsed = time.monotonic() - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        parts = [
            f"route {self.route}: {self.done:,}/{self.plan.planned:,} moved ({self._share():.0f}%)",
            f"{rate:,.0f} msg/s",
        ]
        if rate > 0:
            parts.append(f"~{duration((self.plan.planned - self.done) / rate)} left")
        parts += [describe_stages(stages_of(self.sc, self.group)), duration(elapsed)]
        return ", ".join(parts)

    def _share(self) -> float:
        return 100 * self.done / self.plan.planned if self.plan.planned else 100.0


def _task_error(exc: BaseException) -> str:
    found = _TASK_ERROR.findall(str(exc))
    if found:
        return str(found[-1]).strip()
    first = next((line for line in str(exc).splitlines() if line.strip()), "")
    return f"the Spark job failed: {type(exc).__name__}: {first}"


def _where(config: BridgeConfig, connection: str, address: str) -> str:
    return f"{config.connections[connection].type} {connection}/{address}"
