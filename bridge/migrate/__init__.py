"""Bulk moves and queue reports as PySpark jobs: `bridge migrate` and `bridge report`.

The runtime never imports this package, and nothing outside it imports pyspark: the CLI imports
it lazily and `require_spark` turns a missing PySpark into a clear error.

What runs where
    The driver plans: it reads the source's extent (a SQL table's lowest and highest sequence
    number, or each Kafka partition's start and end offset), splits it into ranges and hands
    each range to a Spark task. A task loads routes.yaml itself from the text and environment
    values the driver shipped (`spec.JobSpec`), opens the same transports the service uses and
    runs the route's own `RouteRunner` over a source bounded to its range (`bounded`), until
    the range is empty.

Guarantees (migrate)
    The service's: a batch leaves its source only after its destination made it durable, so a
    failed or retried task loses nothing and duplicates at most the batch it had in flight.
    SQL sources receive destructively (`SqlSource(seq_range=...)`, `FOR UPDATE SKIP LOCKED` /
    `READPAST`), so the service can keep running next to the job; rows inserted after the job
    planned are the service's. A route between two tables of one database moves each batch in
    one transaction. Kafka -> SQL stores each partition's next offset with the rows, under the
    names the service uses (`group/topic/partition`), so it is exactly-once and the service
    resumes where the job stopped (do not run the route's service at the same time).

Modules
    spec      what a task needs (config text, environment values, route), picklable
    ranges    splitting a sequence range
    session   the SparkSession (local defaults, reuse of an active one, Spark's output hidden)
    progress  the status line on a terminal, and Ctrl-C (cancel the jobs, say what was done)
    bounded   a route run until its bounded source is exhausted
    sqltask   a SQL sequence range -> the route's destination
    kafkatask a Kafka partition's offset range -> a SQL queue table
    plans     how a route's backlog splits into tasks, and how far it is
    driver    `bridge migrate`: plan, run, progress, summary
    report    `bridge report`: scan queue tables, aggregate with Spark SQL
    render    the report as a table, JSON or CSV
    job       the `spark-submit` entry point
"""

from __future__ import annotations

from bridge.errors import BridgeError

__all__ = ["require_spark"]


def require_spark(command: str = "migrate") -> None:
    """Raise a BridgeError naming the extra to install when PySpark is missing."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise BridgeError(
            f"bridge {command} runs on Apache Spark, and PySpark is not installed: "
            "pip install './[spark]' in the bridge checkout (Spark also needs Java 17 or newer)"
        ) from None
