"""`bridge report CONNECTION QUEUE...`: what SQL queue tables hold, read in parallel by Spark.

Reading
    Non-destructive: SELECT only (`scan_range`, with `READPAST` on SQL Server), so the service
    and a running migration go on undisturbed; the report is a snapshot per range, not a
    transaction over the whole table. The driver splits each table's sequence range into
    `partitions` parts (default 4 x Spark's default parallelism); each task pages through its
    part, decodes the Headers column with the SQL transport's codec and keeps one small row per
    message (never the body, only its size).

Figures, per queue
    messages, expired (by the database clock), poison (Headers unreadable); body size min, p50,
    p90, p99, max and counts per size bucket; age from `NServiceBus.TimeSent` (min, p50, p90,
    p99, max seconds, over the messages that have a readable one); counts by message type (the
    first of `NServiceBus.EnclosedMessageTypes`, cut at its first comma: the type name without
    the assembly), by `NServiceBus.MessageIntent` and by `NServiceBus.OriginatingEndpoint`
    (poison rows excluded, a missing header counted as `(none)`); the `top` largest messages
    (`NServiceBus.MessageId`, the native id for poison rows; type; size). Percentiles are
    Spark's `percentile_approx`: a value of the data, exact at these sizes.

Progress and Ctrl-C (`progress`)
    On a terminal a status line shows Spark starting, then the rows read and the ranges done
    (counted as each task ends), the rate, the time left, and Spark's stage and tasks. Ctrl-C
    cancels the jobs and raises `Interrupted` saying how far the reading got; nothing is
    printed of a report cut short.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from bridge.config.models import SQL_TYPES
from bridge.envelope import TIME_SENT
from bridge.errors import ConfigError, HeadersFormatError
from bridge.migrate.progress import (
    Interrupted,
    StatusLine,
    describe_stages,
    duration,
    interruptible,
    job_group,
    stages_of,
)
from bridge.migrate.ranges import split
from bridge.migrate.session import check_master, spark_session
from bridge.migrate.spec import ShippedConfig
from bridge.nservicebus.wireformat import timestamp_seconds
from bridge.transports import load
from bridge.transports.sql import ScannedRow
from bridge.transports.sql import Transport as SqlTransport

if TYPE_CHECKING:
    from pyspark import Accumulator, SparkContext
    from pyspark.sql import DataFrame

__all__ = ["SIZE_BUCKETS", "QueueReport", "Report", "build_report", "describe_row"]

#: (lower bound in bytes, label); a body falls in the last bucket whose bound it reaches.
SIZE_BUCKETS = (
    (0, "< 1 KiB"),
    (1024, "1-10 KiB"),
    (10 * 1024, "10-100 KiB"),
    (100 * 1024, "100 KiB-1 MiB"),
    (1024 * 1024, ">= 1 MiB"),
)
PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
NONE = "(none)"
PAGE = 1000

MESSAGE_ID = "NServiceBus.MessageId"
TYPES = "NServiceBus.EnclosedMessageTypes"
INTENT = "NServiceBus.MessageIntent"
ENDPOINT = "NServiceBus.OriginatingEndpoint"

_SCHEMA = (
    "queue string, id string, type string, intent string, endpoint string, size long, "
    "sent double, expired boolean, poison boolean, bucket int"
)


@dataclass
class QueueReport:
    queue: str
    messages: int = 0
    expired: int = 0
    poison: int = 0
    body_size: dict[str, int | None] = field(default_factory=dict)
    size_buckets: dict[str, int] = field(default_factory=dict)
    age_seconds: dict[str, float | None] = field(default_factory=dict)
    by_type: dict[str, int] = field(default_factory=dict)
    by_intent: dict[str, int] = field(default_factory=dict)
    by_endpoint: dict[str, int] = field(default_factory=dict)
    largest: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        stats = ("min", *(name for name, _ in PERCENTILES), "max")
        self.body_size = {name: self.body_size.get(name) for name in stats}
        self.age_seconds = {name: self.age_seconds.get(name) for name in stats}
        self.size_buckets = {label: self.size_buckets.get(label, 0) for _, label in SIZE_BUCKETS}


@dataclass
class Report:
    connection: str
    kind: str
    queues: list[QueueReport]
    generated_at: float
    seconds: float = 0.0


def describe_row(queue: str, row: ScannedRow) -> tuple[Any, ...]:
    """The report's row for one message (`_SCHEMA`); no body, only its size."""
    bucket = max(i for i, (bound, _) in enumerate(SIZE_BUCKETS) if row.body_size >= bound)
    try:
        headers = row.decoded_headers()
    except HeadersFormatError:
        unreadable = (None, None, None, row.body_size, None, row.expired, True, bucket)
        return (queue, row.native_id, *unreadable)
    first_type = (headers.get(TYPES) or "").split(";")[0].split(",")[0].strip()
    sent: float | None = None
    raw_sent = headers.get(TIME_SENT)
    if raw_sent:
        try:
            sent = timestamp_seconds(raw_sent)
        except ValueError:
            sent = None
    return (
        queue,
        headers.get(MESSAGE_ID) or row.native_id,
        first_type or None,
        headers.get(INTENT),
        headers.get(ENDPOINT),
        row.body_size,
        sent,
        row.expired,
        False,
        bucket,
    )


def scan_task(
    shipped: ShippedConfig, connection: str, item: tuple[str, int, int]
) -> Iterator[tuple[Any, ...]]:
    """The Spark task: every row of one range of one queue, as `describe_row` tuples."""
    queue, lo, hi = item
    return iter(asyncio.run(_scan(shipped, connection, queue, lo, hi)))


def _counted_scan(
    shipped: ShippedConfig,
    connection: str,
    read: Accumulator[tuple[int, int]],
    item: tuple[str, int, int],
) -> list[tuple[Any, ...]]:
    """`scan_task`, adding (rows, 1) to `read` for the progress line once the range is read."""
    rows = list(scan_task(shipped, connection, item))
    read.add((len(rows), 1))
    return rows


async def _scan(
    shipped: ShippedConfig, connection: str, queue: str, lo: int, hi: int
) -> list[tuple[Any, ...]]:
    transport = _sql_transport(shipped, connection)
    out: list[tuple[Any, ...]] = []
    try:
        after = lo - 1
        while True:
            rows = await transport.scan_range(queue, after, hi, PAGE)
            out.extend(describe_row(queue, row) for row in rows)
            if len(rows) < PAGE:
                return out
            after = rows[-1].seq
    finally:
        await transport.close()


def _sql_transport(shipped: ShippedConfig, connection: str) -> SqlTransport:
    config = shipped.config()
    settings = config.connections.get(connection)
    if settings is None:
        known = ", ".join(sorted(config.connections)) or "none"
        raise ConfigError(f"no connection named {connection!r} in the config (known: {known})")
    if settings.type not in SQL_TYPES:
        raise ConfigError(
            f"bridge report reads SQL queue tables; connection {connection!r} is {settings.type}"
        )
    transport = load(connection, settings)
    assert isinstance(transport, SqlTransport)
    return transport


async def build_report(
    shipped: ShippedConfig,
    connection: str,
    queues: list[str],
    *,
    top: int = 10,
    master: str | None,
    partitions: int | None = None,
    status: StatusLine | None = None,
) -> Report:
    """Scan `queues` of `connection` with Spark and aggregate them (see the module docstring).
    `status`: the terminal's status line (default: stderr's); Ctrl-C raises Interrupted."""
    if partitions is not None and partitions < 1:
        raise ConfigError("--partitions must be at least 1")
    if top < 0:
        raise ConfigError("--top must be 0 or more")
    check_master(master)
    queues = list(dict.fromkeys(queues))
    transport = _sql_transport(shipped, connection)
    try:
        await transport.check(queues)
        bounds = {queue: await transport.bounds(queue) for queue in queues}
    finally:
        await transport.close()
    report = Report(connection, transport.kind, [QueueReport(q) for q in queues], 0.0)
    began = time.monotonic()
    report.generated_at = time.time()
    if all(extent is None for extent in bounds.values()):
        return report
    with status if status is not None else StatusLine() as line:
        line.starting(f"report {connection}", master, began)
        with spark_session(f"bridge report {connection}", master) as spark:
            sc = spark.sparkContext
            parts = partitions or 4 * sc.defaultParallelism
            items = [
                (queue, lo, hi)
                for queue, extent in bounds.items()
                if extent is not None
                for lo, hi in split(*extent, parts)
            ]
            read = _pairs(sc)
            rows = sc.parallelize(items, len(items)).flatMap(
                partial(_counted_scan, shipped, connection, read)
            )
            frame = spark.createDataFrame(rows, _SCHEMA).cache()
            group = job_group()
            started = time.monotonic()
            line.show(partial(_status, sc, group, connection, read, len(items), started))
            reports = {q.queue: q for q in report.queues}
            try:
                await interruptible(
                    sc,
                    group,
                    f"bridge report {connection}",
                    partial(_aggregate, frame, reports, report.generated_at, top),
                )
            except Interrupted:
                raise Interrupted(
                    f"interrupted after reading {read.value[0]:,} rows "
                    f"({read.value[1]} of {len(items)} ranges) in "
                    f"{duration(time.monotonic() - started)}; no report printed"
                ) from None
            finally:
                line.close()  # before Spark stops: the line reads its status tracker
                frame.unpersist()
    report.seconds = time.monotonic() - began
    return report


def _pairs(sc: SparkContext) -> Accumulator[tuple[int, int]]:
    from pyspark.accumulators import AccumulatorParam

    class Pairs(AccumulatorParam[tuple[int, int]]):
        def zero(self, value: tuple[int, int]) -> tuple[int, int]:
            return (0, 0)

        def addInPlace(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
            return (a[0] + b[0], a[1] + b[1])

    return sc.accumulator((0, 0), Pairs())


def _status(
    sc: SparkContext,
    group: str,
    connection: str,
    read: Accumulator[tuple[int, int]],
    ranges: int,
    started: float,
) -> str:
    """The status line: rows read and ranges done, then the aggregation's stages."""
    rows, done = read.value
    elapsed = time.monotonic() - started
    parts = [f"report {connection}: {rows:,} rows read ({done}/{ranges} ranges)"]
    if done < ranges:
        parts.append(f"{rows / elapsed if elapsed > 0 else 0.0:,.0f} rows/s")
        if done:
            parts.append(f"~{duration(elapsed * (ranges - done) / done)} left")
    else:
        parts.append("aggregating")
    parts += [describe_stages(stages_of(sc, group)), duration(elapsed)]
    return ", ".join(parts)


def _aggregate(frame: DataFrame, reports: dict[str, QueueReport], now: float, top: int) -> None:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    fractions = [fraction for _, fraction in PERCENTILES]
    age = F.lit(now) - F.col("sent")
    totals = frame.groupBy("queue").agg(
        F.count(F.lit(1)).alias("messages"),
        F.sum(F.col("expired").cast("long")).alias("expired"),
        F.sum(F.col("poison").cast("long")).alias("poison"),
        F.min("size").alias("size_min"),
        F.max("size").alias("size_max"),
        F.percentile_approx("size", fractions, 10_000).alias("size_p"),
        F.min(age).alias("age_min"),
        F.max(age).alias("age_max"),
        F.percentile_approx(age, fractions, 10_000).alias("age_p"),
    )
    for row in totals.collect():
        report = reports[row["queue"]]
        report.messages, report.expired, report.poison = (
            row["messages"],
            row["expired"],
            row["poison"],
        )
        size_p = row["size_p"] or [None] * len(PERCENTILES)
        age_p = row["age_p"] or [None] * len(PERCENTILES)
        report.body_size = {
            "min": row["size_min"],
            **{name: value for (name, _), value in zip(PERCENTILES, size_p, strict=True)},
            "max": row["size_max"],
        }
        report.age_seconds = {
            "min": _seconds(row["age_min"]),
            **{name: _seconds(value) for (name, _), value in zip(PERCENTILES, age_p, strict=True)},
            "max": _seconds(row["age_max"]),
        }
    for row in frame.groupBy("queue", "bucket").count().collect():
        reports[row["queue"]].size_buckets[SIZE_BUCKETS[row["bucket"]][1]] = row["count"]
    readable = frame.where(~F.col("poison"))
    for column, attr in (("type", "by_type"), ("intent", "by_intent"), ("endpoint", "by_endpoint")):
        counts = readable.groupBy("queue", F.coalesce(F.col(column), F.lit(NONE)).alias("key"))
        for row in counts.count().orderBy(F.desc("count"), "key").collect():
            getattr(reports[row["queue"]], attr)[row["key"]] = row["count"]
    if top:
        order = Window.partitionBy("queue").orderBy(F.desc("size"), F.asc("id"))
        ranked = frame.withColumn("rank", F.row_number().over(order)).where(F.col("rank") <= top)
        for row in ranked.orderBy("queue", "rank").collect():
            reports[row["queue"]].largest.append(
                {"id": row["id"], "type": row["type"], "size": row["size"]}
            )


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
