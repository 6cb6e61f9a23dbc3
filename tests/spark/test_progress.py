"""`bridge migrate` and `bridge report` as a user runs them, each in a process of its own (its
own JVM): a status line on a terminal, Spark's own output out of sight unless asked for, and
Ctrl-C saying what moved (exit 130)."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from bridge.config.loader import load_config
from bridge.transports import load
from tests.spark.conftest import write_routes
from tests.spark.data import message

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 10_000
MASTER = "local[2]"

#: What Spark and its JVM print by themselves, which a user did not ask for.
SPARK_NOISE = re.compile(
    r"log4j|Using incubator modules|Setting default log level|NativeCodeLoader|"
    r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d (INFO|WARN) "
)


@pytest.fixture
async def routes(tmp_path: Path, pg_dsn: str, pg_schema: str) -> Path:
    """ROWS messages in PostgreSQL `Orders`, and two routes moving them to SQLite: `to-local`,
    and `slowly`, in small batches so that its job lasts long enough to be interrupted."""
    path = write_routes(
        tmp_path / "routes.yaml",
        f"""
        shop: {{type: postgresql, dsn: "{pg_dsn}", schema: "{pg_schema}"}}
        local: {{type: sqlite, path: "{tmp_path / "local.db"}"}}
        """,
        """
        - name: to-local
          from: {connection: shop, queue: Orders}
          to: {connection: local, queue: Orders}
        - name: slowly
          from: {connection: shop, queue: Orders}
          to: {connection: local, queue: Orders}
          batch_size: 10
        """,
    )
    config = load_config(path).config
    shop, local = (
        load("shop", config.connections["shop"]),
        load("local", config.connections["local"]),
    )
    await shop.install(["Orders", "bridge.error"])
    await local.install(["Orders"])
    sink = shop.sink("Orders")
    for start in range(0, ROWS, 2000):
        await sink.send([message(n) for n in range(start, start + 2000)])
    await sink.close()
    await shop.close()
    await local.close()
    return path


def bridge(*args: str) -> list[str]:
    return [sys.executable, "-m", "bridge", *args, "--master", MASTER]


def on_terminal(
    command: list[str], *, until: Callable[[str], bool] | None = None, timeout: float = 240
) -> tuple[int, str]:
    """Run `command` with stdout and stderr on a pseudo-terminal; once `until(output so far)`
    holds, send SIGINT to its process group, as Ctrl-C on a terminal does. (exit code, output)."""
    main, terminal = os.openpty()
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, start_new_session=True
    )
    os.close(terminal)
    output = b""
    deadline = time.monotonic() + timeout
    interrupted = False
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(main, 65536)
                except OSError:  # the terminal's other side closed: the process ended
                    break
                if not chunk:
                    break
                output += chunk
            if until is not None and not interrupted and until(output.decode(errors="replace")):
                os.killpg(process.pid, signal.SIGINT)
                interrupted = True
        code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(main)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert until is None or interrupted, "the job ended before it could be interrupted"
    return code, output.decode(errors="replace")


def drawn(output: str) -> list[str]:
    """Each state of the status line: the text between a carriage return and clear-to-end."""
    return re.findall(r"\r([^\r\n]*)\x1b\[K", output)


def rows_left(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn) as db:
        row = db.execute(f'SELECT count(*) FROM "{schema}"."Orders"').fetchone()
    assert row is not None
    return int(row[0])


def test_report_shows_a_status_line_on_a_terminal(routes: Path) -> None:
    code, output = on_terminal(bridge("report", "shop", "Orders", "-c", str(routes)))
    assert code == 0, output
    lines = [line for line in drawn(output) if line]
    assert lines[0].startswith(f"report shop: starting Spark on {MASTER}, ")
    reading = [line for line in lines if "rows read (" in line]
    assert reading, lines
    last = reading[-1]
    assert re.match(rf"report shop: {ROWS:,} rows read \(\d+/\d+ ranges\), aggregating, ", last)
    assert any(re.search(r"\d rows/s, ~\d+s left, ", line) for line in reading), reading
    assert any(re.search(r"stage \d+: tasks \d+/\d+, \d+s$", line) for line in reading), reading
    # The line is erased before the report, which follows it whole.
    _, _, report = output.rpartition("\r\x1b[K")
    assert report.startswith("postgresql connection shop, "), report[:200]
    assert f"messages {ROWS}" in report
    assert not SPARK_NOISE.search(output), output


def test_spark_output_is_hidden_unless_asked_for(routes: Path) -> None:
    quiet = subprocess.run(
        bridge("migrate", "--route", "to-local", "-c", str(routes)),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert quiet.returncode == 0, quiet.stderr
    assert (
        quiet.stdout.startswith("migrated route to-local ") and f"moved    {ROWS}\n" in quiet.stdout
    )
    # Only bridge's own lines: the config's warnings, then its log (not being a terminal, a
    # progress line every few seconds).
    for line in quiet.stderr.splitlines():
        ours = line.startswith(f"{routes}:") and ": warning: " in line
        assert ours or re.match(
            r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ INFO bridge\.migrate: ", line
        ), line
    assert f"moving {ROWS} messages in " in quiet.stderr
    # Asked for: Spark's own output on stderr, and never on stdout, which is the command's
    # (the report of where the rows went).
    shown = subprocess.run(
        bridge("report", "local", "Orders", "-c", str(routes), "--json"),
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "BRIDGE_SPARK_LOGS": "1"},
    )
    assert shown.returncode == 0, shown.stderr
    assert SPARK_NOISE.search(shown.stderr), shown.stderr
    assert shown.stdout.startswith("{") and not SPARK_NOISE.search(shown.stdout)


def test_ctrl_c_stops_the_job_and_says_what_moved(
    routes: Path, pg_dsn: str, pg_schema: str
) -> None:
    def moving(output: str) -> bool:  # rows have left the source: the job is under way
        return rows_left(pg_dsn, pg_schema) < ROWS

    code, output = on_terminal(
        bridge("migrate", "--route", "slowly", "-c", str(routes)), until=moving
    )
    assert code == 130, output
    assert "Traceback" not in output
    summary = output.rpartition("\r\x1b[K")[2]
    assert summary.startswith("interrupted migrating route slowly (postgresql shop/Orders -> ")
    said = re.search(
        r"bridge migrate: interrupted: ([\d,]+) of ([\d,]+) messages moved, ([\d,]+) left in "
        r"the source; run it again to move the rest",
        summary,
    )
    assert said, summary
    moved, planned, left = (int(group.replace(",", "")) for group in said.groups())
    assert planned == ROWS and moved + left == ROWS
    assert 0 < moved < ROWS
    assert left == rows_left(pg_dsn, pg_schema)  # what it says is what the source holds
    assert f"  moved    {moved}\n" in summary.replace("\r\n", "\n")
    assert any(line.startswith("route slowly: ") for line in drawn(output))  # it was shown
