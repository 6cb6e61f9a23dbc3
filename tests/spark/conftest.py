"""One local SparkSession for the whole test run, shared by every Spark test.

`local[2,2]`: two cores, and a failed task is tried twice (local mode takes its retries from
the master URL; `spark.task.maxFailures` says the same for clusters). The jobs under test find
this session active and use it instead of starting their own. PySpark and Java are hard
requirements: a missing one fails the tests, it never skips them.
"""

from __future__ import annotations

import logging
import os
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

MASTER = "local[2,2]"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        pytest.fail(f"PySpark is required for the Spark tests: {exc} (pip install './[spark]')")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    try:
        session = (
            SparkSession.builder.master(MASTER)
            .appName("bridge tests")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.task.maxFailures", "2")
            .config("spark.log.level", "FATAL")
            .getOrCreate()
        )
    except Exception as exc:  # no Java, most often
        pytest.fail(f"Spark could not start (it needs Java 17+): {exc}")
    yield session
    session.stop()


Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Iterator[Cli]:
    """`bridge ...` in this process (on the test run's SparkSession): (exit code, stdout,
    stderr), never a traceback; the logging set-up it changes is put back afterwards."""
    from bridge.cli import main

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out, err = capsys.readouterr()
        assert "Traceback" not in out + err, err
        return code, out, err

    yield run
    root.handlers[:] = handlers
    root.setLevel(level)


def write_routes(path: Path, connections: str, routes: str) -> Path:
    """A routes.yaml from two indented YAML blocks."""
    path.write_text(
        "connections:\n"
        + textwrap.indent(textwrap.dedent(connections).strip(), "  ")
        + "\nroutes:\n"
        + textwrap.indent(textwrap.dedent(routes).strip(), "  ")
        + "\n"
    )
    return path
