"""The job's SparkSession: reuse an active one, else start one with quiet local defaults.

Defaults are set only where the submitter did not set them (`spark-submit --conf` wins): the
web UI and Spark's console progress bar off (the job shows its own progress, `progress`), few
shuffle partitions (the aggregations are small), no speculative task attempts.

Spark's own output stays out of sight unless asked for (`--log-level DEBUG`, or
`BRIDGE_SPARK_LOGS=1`): its log at FATAL, so a failed task reaches the user as one line from
the job, not as a Java log with a Python traceback; and when this process starts the JVM, what
the JVM writes itself (the log4j profile it picked, the incubator-module warning, native
library notes) goes to a scratch file, whose last lines are shown only if the JVM fails to
start. Asked for, Spark logs at WARN and the JVM writes to stderr (never to stdout, which
carries the command's output).

For a local master, the workers run this interpreter (`PYSPARK_PYTHON`) and Spark binds to
127.0.0.1 (`SPARK_LOCAL_IP`), unless those are set already. PySpark takes over SIGINT when
it starts (to cancel every job and raise KeyboardInterrupt wherever the main thread is); the
handler that was there before is put back, so Ctrl-C cancels the command's own asyncio task,
which cancels its Spark jobs and says what was done (`progress.interruptible`).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING

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


#: What the JVM writes itself while Spark's output is hidden (kept open: the JVM writes on).
_jvm_output: IO[bytes] | None = None

#: Lines the JVM prints on every start, never the reason it failed.
_NOISE = re.compile(
    r"WARNING: Using incubator modules|Using Spark's default log4j profile|"
    r"Setting default log level to|To adjust logging level use|"
    r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d (TRACE|DEBUG|INFO|WARN) "
)


def spark_logs_shown() -> bool:
    """Spark's own output is asked for: bridge logs at DEBUG, or BRIDGE_SPARK_LOGS is set."""
    debug = logging.getLogger("bridge").getEffectiveLevel() <= logging.DEBUG
    return debug or os.environ.get("BRIDGE_SPARK_LOGS", "") not in ("", "0")


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
    shown = spark_logs_shown()
    given = SparkConf()
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    settings = {"spark.app.name": app_name} | ({"spark.master": master} if master else {})
    defaults = {**DEFAULTS, "spark.log.level": "WARN" if shown else "FATAL"}
    for key, value in defaults.items():
        if not given.contains(key):
            builder = builder.config(key, value)
            settings[key] = value
    sigint = signal.getsignal(signal.SIGINT)
    try:
        with warnings.catch_warnings():  # PySpark's notes on optional pandas versions
            warnings.simplefilter("ignore", FutureWarning)
            _launch_jvm(settings, shown=shown)
            session = builder.getOrCreate()
    except Exception as exc:  # no Java, a bad master URL, a cluster out of reach
        first = next((line for line in str(exc).splitlines() if line.strip()), "")
        why = _jvm_said()
        raise BridgeError(
            f"could not start Spark (master {master or 'from spark-submit'}): {first}"
            + (f" ({why})" if why else "")
        ) from None
    finally:
        if sigint is not None and signal.getsignal(signal.SIGINT) is not sigint:
            signal.signal(signal.SIGINT, sigint)  # PySpark's own, when started here
    try:
        yield session
    finally:
        session.stop()


def _launch_jvm(settings: dict[str, str], *, shown: bool) -> None:
    """Start the JVM PySpark talks to, unless it runs already (spark-submit started it, or a
    session before this one): its own output to a scratch file, or with `shown` to stderr."""
    global _jvm_output
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    conf = SparkConf(loadDefaults=False)
    conf.setAll(list(settings.items()))
    output: IO[bytes] | int = 2  # stderr, also for what the JVM prints on its stdout
    if not shown:
        _jvm_output = output = tempfile.TemporaryFile()  # noqa: SIM115 (the JVM's, for good)
    gateway = launch_gateway(  # type: ignore[no-untyped-call]
        conf, popen_kwargs={"stdout": output, "stderr": output}
    )
    SparkContext._ensure_initialized(gateway=gateway)


def _jvm_said(lines: int = 3) -> str:
    """The JVM's last `lines` that are not its start-up noise: why it failed to start."""
    if _jvm_output is None:
        return ""
    _jvm_output.seek(0)
    text = _jvm_output.read()[-8192:].decode("utf-8", "replace")
    said = [line.strip() for line in text.splitlines() if line.strip()]
    return "; ".join([line for line in said if not _NOISE.match(line)][-lines:])
