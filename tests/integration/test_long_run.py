"""A long run against a slow destination: the bridge's footprint stays flat.

A `bridge run` moves 5,000 messages from SQLite to PostgreSQL two at a time (2,500 batches)
while a trigger makes every insert statement on the destination sleep. Every half second the
test samples the process's resident memory and threads (/proc) and its PostgreSQL
connections (pg_stat_activity, by the DSN's application_name). After a warm-up they must stay
flat: memory within a generous bound, threads and connections constant. Every message must
arrive, once.
"""

from __future__ import annotations

import json
import sqlite3
import textwrap
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import unique
from tests.faults import BridgeProcess
from tests.support.localkafka import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BATCH = 2
BATCHES = 2_500
TOTAL = BATCH * BATCHES
WARM_UP = TOTAL // 10  # messages forwarded before the baseline sample
SLEEP_PER_INSERT = 0.005  # seconds, per insert statement (one per batch)
# Bytes of RSS growth after the warm-up: a leak of 4 KiB a batch crosses it. Measured: about
# 1.2 MiB, all of it before batch 1,700, flat from there to the end.
RSS_GROWTH_BOUND = 8 * 1024 * 1024
SAMPLE_EVERY = 0.5


@dataclass(frozen=True)
class Sample:
    forwarded: int
    rss: int  # bytes
    threads: int
    connections: int


def proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":", 1) for line in lines if ":" in line)


def message_id(headers: str) -> str:
    return str(json.loads(headers)["NServiceBus.MessageId"])


def route_stats(port: int) -> dict[str, Any]:
    """The one route's counters, from the service's /routes."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/routes", timeout=5) as response:
        (route,) = json.loads(response.read())["routes"]
    return dict(route)


def test_a_long_run_to_a_slow_destination_keeps_memory_threads_and_connections_flat(
    tmp_path: Path, pg_dsn: str, pg_schema: str
) -> None:
    app = unique("longrun")
    dsn = f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}application_name={app}"
    port = free_port()
    config = tmp_path / "routes.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            http: {{host: 127.0.0.1, port: {port}}}
            connections:
              local: {{type: sqlite, path: "{tmp_path / "local.db"}"}}
              shop: {{type: postgresql, dsn: "{dsn}", schema: "{pg_schema}"}}
            routes:
              - name: local-to-shop
                from: {{connection: local, queue: In}}
                to: {{connection: shop, queue: Out}}
                batch_size: {BATCH}
            """
        )
    )
    for command in (("install",), ("send", "local", "In", "--count", str(TOTAL))):
        with BridgeProcess(config, *command).start() as step:
            assert step.wait() == 0, step.output()
    with sqlite3.connect(tmp_path / "local.db") as local:
        sent = {message_id(row[0]) for row in local.execute('SELECT headers FROM "In"')}
    assert len(sent) == TOTAL

    with psycopg.connect(pg_dsn, autocommit=True) as db:
        db.execute(
            f"""
            CREATE FUNCTION "{pg_schema}".slow() RETURNS trigger LANGUAGE plpgsql
            AS $$ BEGIN PERFORM pg_sleep({SLEEP_PER_INSERT}); RETURN NULL; END $$;
            CREATE TRIGGER slow AFTER INSERT ON "{pg_schema}"."Out"
            FOR EACH STATEMENT EXECUTE FUNCTION "{pg_schema}".slow();
            """.encode()
        )

        def connections() -> int:
            query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            row = db.execute(query, (app,)).fetchone()
            assert row is not None
            return int(row[0])

        samples: list[Sample] = []
        started = time.monotonic()
        with BridgeProcess(config, "run").start() as bridge:
            while not samples or samples[-1].forwarded < TOTAL:
                assert bridge.running, bridge.output()
                assert time.monotonic() - started < 120, f"stuck: {samples[-1:]}"
                time.sleep(SAMPLE_EVERY)
                # /proc first: the HTTP server answers /routes on a thread of its own
                status = proc_status(bridge.pid)
                try:
                    moved = route_stats(port)["forwarded"]
                except OSError:  # the HTTP server is not up yet
                    continue
                rss = int(status["VmRSS"].split()[0]) * 1024
                samples.append(Sample(moved, rss, int(status["Threads"]), connections()))
            batches = route_stats(port)["batches"]
            assert bridge.stop() == 0, bridge.output()  # SIGTERM: finish, commit, exit 0
        elapsed = time.monotonic() - started
        rows = db.execute(f'SELECT headers FROM "{pg_schema}"."Out"').fetchall()
        arrived = [message_id(headers) for (headers,) in rows]

    warm = [s for s in samples if s.forwarded >= WARM_UP]
    baseline, end = warm[0], warm[-1]
    print(
        f"\n{TOTAL} messages in {batches} batches, {elapsed:.1f} s, {len(samples)} samples; "
        f"RSS {samples[0].rss / 2**20:.1f} MiB at start, {baseline.rss / 2**20:.1f} after "
        f"warm-up, {end.rss / 2**20:.1f} at the end (max {max(s.rss for s in warm) / 2**20:.1f}); "
        f"threads {sorted({s.threads for s in warm})}; "
        f"PostgreSQL connections {sorted({s.connections for s in warm})}"
    )
    assert len(warm) >= 10, "too few samples after the warm-up to say anything"
    assert max(s.rss for s in warm) - baseline.rss < RSS_GROWTH_BOUND
    assert {s.threads for s in warm} == {baseline.threads}
    assert {s.connections for s in warm} == {baseline.connections} and baseline.connections > 0
    assert batches == BATCHES
    assert len(arrived) == TOTAL and set(arrived) == sent
