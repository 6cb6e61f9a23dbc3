"""The job's SparkSession: reuse an active one, else start one with quiet local defaults.

Defaults are set only where the submitter did not set them (`spark-submit --conf` wins): the
web UI and Spark's console progress bar off (the job prints its own progress), few shuffle
partitions (the aggregations are small), no speculative task attempts, and Spark's own log
at FATAL unless bridge logs at DEBUG, so a failed task reaches the user as one line from the
job, not as a Java log with a Python traceback. For a local master, the workers run this
interpreter (`PYSPARK_PYTHON`) and Spark binds to 127.0.0.1 (`SPARK_LOCAL_IP`), unless those
are set already.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from bridge.errors import BridgeError, ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["check_master", "spark_session"]

#: The master URL forms Spark knows (a typo would otherwise surface as a Java stack trace).
_MASTER = re.compile(
    r"local(\[(\d+|\*)(\s*,\s*\d+)?\])?|local-cluster\[.+\]|spark://\S+|yarn|k8s://\S+|mesos://\S+"
)


def check_master(master: str | None) -> None:
    """Raise ConfigError when `master` is not of a form Spark accepts (None: spark-submit's)."""
    if master is not None and not _MASTER.fullmatch(master):
        raise ConfigError(
            f"--master {master!r} is not a Spark master URL: use local, local[N], local[*], "
            "local[N,F] (F tries per task), spark://HOST:PORT, yarn, k8s://URL or mesos://URL"
        )


DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    # A second attempt of a running task only competes with it: a SQL range has nothing left
    # for it, and a Kafka partition's attempts are fenced so the loser fails (kafkatask).
    "spark.speculation": "false",
}


@contextmanager
def spark_session(app_name: str, master: str | None) -> Iterator[SparkSession]:
    """The active session (left running), or a new one stopped on exit.

    `master` None leaves the master to `spark-submit` (or `spark.master` in its defaults).
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    logging.getLogger("py4j").setLevel(logging.WARNING)
    if SparkContext._active_spark_context is not None:  # a test run's or a notebook's
        yield SparkSession.builder.getOrCreate()
        return
    if master is not None and master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    given = SparkConf()
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    debug = logging.getLogger("bridge").getEffectiveLevel() <= logging.DEBUG
    defaults = {**DEFAULTS, "spark.log.level": "WARN" if debug else "FATAL"}
    for key, value in defaults.items():
        if not given.contains(key):
            builder = builder.config(key, value)
    try:
        with warnings.catch_warnings():  # PySpark's notes on optional pandas versions
            warnings.simplefilter("ignore", FutureWarning)
            session = builder.getOrCreate()
    except Exception as exc:  # no Java, a bad master URL, a cluster out of reach
        first = next((line for line in str(exc).splitlines() if line.strip()), "")
        raise BridgeError(
            f"could not start Spark (master {master or 'from spark-submit'}): {first}"
        ) from None
    try:
        yield session
    finally:
        session.stop()
