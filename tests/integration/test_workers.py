"""`bridge run --workers 2` as a real process tree: the primary's status pages over both
workers, a worker killed with -9 and started again, a primary killed with -9 that takes its
workers with it, and `--until-idle` with workers. Every case counts what arrived: nothing lost,
duplicates at most the killed worker's batch in hand."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge.config.loader import load_config
from bridge.envelope import Envelope, Headers
from bridge.transports import load
from tests.conftest import PG_DSN, unique
from tests.faults import report
from tests.integration.test_http import SECRET, get, wait_for
from tests.support.localkafka import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BRIDGE = [sys.executable, "-m", "bridge"]
BATCH = 50  # the route's batch_size: what one worker has in hand at most (concurrency 1)
STARTED = re.compile(r"worker (\d+) started \(pid (\d+)\)")


def write_config(
    path: Path, schema: str | None, src: str, dst: str, port: int | None = None
) -> Path:
    """One route `move` from queue `src` of connection src to queue `dst` of connection dst,
    batches of BATCH: two SQLite files (`schema` None) or two connections to one PostgreSQL
    schema; installed. And a connection with a secret in its DSN that no log may show."""
    if schema is None:
        source = f'{{type: sqlite, path: "{path.parent / "a.db"}"}}'
        destination = f'{{type: sqlite, path: "{path.parent / "b.db"}"}}'
    else:
        source = destination = f'{{type: postgresql, dsn: "{PG_DSN}", schema: "{schema}"}}'
    http = "" if port is None else f"http: {{host: 127.0.0.1, port: {port}}}"
    path.write_text(
        textwrap.dedent(
            f"""\
            {http}
            connections:
              src: {source}
              dst: {destination}
              down: {{type: postgresql, dsn: "postgresql://postgres:{SECRET}@127.0.0.1:1/x"}}
            routes:
              - name: move
                from: {{connection: src, queue: "{src}"}}
                to: {{connection: dst, queue: "{dst}"}}
                batch_size: {BATCH}
            """
        )
    )
    result = subprocess.run(
        [*BRIDGE, "install", "-c", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return path


def fill(config: Path, connection: str, queue: str, count: int) -> set[str]:
    """`count` messages with ids m0, m1, ... of 1 KB each at `connection`/`queue`."""
    ids = [f"m{i}" for i in range(count)]

    async def send() -> None:
        transport = load(connection, load_config(config).config.connections[connection])
        sink = transport.sink(queue)
        try:
            for start in range(0, count, 1000):
                await sink.send(
                    [
                        Envelope(Headers([("NServiceBus.MessageId", i)]), b"x" * 1000)
                        for i in ids[start : start + 1000]
                    ]
                )
        finally:
            await sink.close()
            await transport.close()

    asyncio.run(send())
    return set(ids)


def take_ids(config: Path, connection: str, queue: str) -> list[str]:
    """Every message id at `connection`/`queue`, duplicates included (takes them off)."""

    async def receive() -> list[str]:
        transport = load(connection, load_config(config).config.connections[connection])
        source = transport.source(queue)
        got: list[str] = []
        try:
            while True:
                batch = await source.receive_batch(1000, 0.2)
                async with batch:
                    got += [e.message_id or "" for e in batch.messages]
                    await batch.commit()
                if not batch.messages:
                    return got
        finally:
            await source.close()
            await transport.close()

    return asyncio.run(receive())


def depth(config: Path, connection: str, queue: str) -> int:
    async def peek() -> int:
        transport = load(connection, load_config(config).config.connections[connection])
        try:
            return (await transport.peek(queue)).depth
        finally:
            await transport.close()

    return asyncio.run(peek())


def pg_count(schema: str, table: str) -> int:
    """Rows in a PostgreSQL queue table (cheap enough to poll while messages move)."""
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{schema}"."{table}"').fetchone()
    assert row is not None
    return int(row[0])


def children(pid: int) -> set[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return set()
    return {int(p) for p in text.split()}


def is_worker(pid: int) -> bool:
    """A live (not zombie) `bridge run --worker-index` process with this pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = stat.rpartition(")")[2].split()[0]
    return state not in ("Z", "X") and b"--worker-index" in cmdline


class Primary:
    """`bridge run --workers 2` with its stderr (and so its workers') in a log file."""

    def __init__(self, config: Path, *args: str) -> None:
        self.log = config.parent / f"{unique('bridge')}.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [*BRIDGE, "run", "-c", str(config), "--workers", "2", *args],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        return self.log.read_text()

    def started(self) -> list[tuple[int, int]]:
        """(index, pid) of every worker the primary started, in order."""
        return [(int(i), int(p)) for i, p in STARTED.findall(self.output())]

    def workers(self) -> dict[int, int]:
        """Each worker's index -> the pid of its latest start."""
        return dict(self.started())

    def wait_for_workers(self) -> dict[int, int]:
        """Both workers started, and the primary's children are just them."""
        wait_for(
            lambda: len(self.workers()) == 2 and children(self.pid) == {*self.workers().values()}
        )
        return self.workers()

    def stop(self) -> int:
        """SIGTERM; its exit code once it exited."""
        self.process.terminate()
        return self.process.wait(timeout=60)


@contextmanager
def primary(config: Path, *args: str) -> Iterator[Primary]:
    """Start the primary; leaving kills whatever of the tree this test started still runs."""
    running = Primary(config, *args)
    try:
        yield running
    finally:
        if running.process.poll() is None:
            running.process.kill()
            running.process.wait(timeout=30)
        for _, pid in running.started():
            if is_worker(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def samples(port: int, name: str) -> dict[str, float]:
    """worker label -> value of the primary's /metrics samples called `name`."""
    status, body = get(port, "/metrics")
    assert status == 200
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            assert "worker" in sample.labels, sample
            if sample.name == name:
                out[sample.labels["worker"]] = out.get(sample.labels["worker"], 0) + sample.value
    return out


def routes(port: int) -> list[dict[str, object]]:
    status, body = get(port, "/routes")
    assert status == 200
    result: list[dict[str, object]] = json.loads(body)["routes"]
    return result


@pytest.mark.timeout(120)
def test_two_workers_share_a_route_and_the_primary_shows_both(tmp_path: Path) -> None:
    count = 2000
    port = free_port()
    config = write_config(tmp_path / "routes.yaml", None, "In", "Out", port)
    sent = fill(config, "src", "In", count)
    with primary(config) as running:
        wait_for(lambda: get(port, "/healthz")[0] == 200)
        pids = running.wait_for_workers()
        assert sorted(pids) == [0, 1] and len(set(pids.values())) == 2
        wait_for(lambda: get(port, "/readyz")[0] == 200)
        wait_for(lambda: routes(port)[0]["forwarded"] == count)
        (route,) = routes(port)
        assert route["name"] == "move" and route["state"] == "running"
        assert route["workers"] == [
            {"worker": 0, "state": "running"},
            {"worker": 1, "state": "running"},
        ]
        assert route["last_error"] is None
        forwarded = samples(port, "bridge_messages_forwarded_total")
        assert set(forwarded) == {"0", "1"} and sum(forwarded.values()) == count
        assert samples(port, "bridge_worker_up") == {"0": 1, "1": 1}
        assert samples(port, "bridge_worker_restarts_total") == {"0": 0, "1": 0}
        assert get(port, "/readyz") == (200, b'{"ready": true, "not_ready": []}')
        assert running.stop() == 0  # each worker finished its batch in hand and committed
        assert not [pid for pid in pids.values() if is_worker(pid)], "a worker outlived it"
    log = running.output()
    assert re.search(r"^\S+ \S+ INFO bridge\.\w+\[worker 0\]: ", log, re.M), log
    assert re.search(r"^\S+ \S+ INFO bridge\.\w+\[worker 1\]: ", log, re.M), log
    assert "starting it again" not in log and "Traceback" not in log, log
    assert SECRET not in log
    assert depth(config, "src", "In") == 0
    report("sqlite->sqlite, --workers 2", sent, take_ids(config, "dst", "Out"), 0)


@pytest.mark.timeout(180)
def test_a_worker_killed_with_9_is_started_again_and_nothing_is_lost(
    tmp_path: Path, pg_schema: str
) -> None:
    total = 10_000
    src, dst = unique("In"), unique("Out")
    port = free_port()
    config = write_config(tmp_path / "routes.yaml", pg_schema, src, dst, port)
    sent = fill(config, "src", src, total)
    with primary(config) as running:
        pids = running.wait_for_workers()
        victim, pid = 1, pids[1]
        # mid-stream: messages arrive, and each worker has moved some of them itself (so the
        # other worker's route is running: a worker that starts late is still `starting`)
        deadline = time.monotonic() + 60
        while pg_count(pg_schema, dst) < total // 10 or not all(
            samples(port, "bridge_messages_forwarded_total").get(str(w)) for w in (0, 1)
        ):
            assert running.process.poll() is None, running.output()
            assert time.monotonic() < deadline, "the route never got going"
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        at_kill = pg_count(pg_schema, dst)
        assert at_kill < total, "the stream ended before the kill"

        killed = re.compile(
            rf"^\S+ \S+ ERROR bridge\.workers: worker {victim} \(pid {pid}\) was killed by "
            r"SIGKILL; starting it again in \d+\.\ds$",
            re.M,
        )
        # not ready until the victim runs again: first down, then its route starting
        wait_for(lambda: get(port, "/readyz")[0] == 503)
        assert json.loads(get(port, "/readyz")[1])["not_ready"] in (
            [{"worker": victim, "state": "down"}],
            [{"route": "move", "state": "starting", "worker": victim}],
            [],  # ready again already
        )
        wait_for(lambda: killed.search(running.output()))
        wait_for(lambda: running.workers()[victim] != pid)
        again = running.workers()[victim]
        wait_for(lambda: children(running.pid) == {pids[0], again})
        assert is_worker(again) and not is_worker(pid)
        wait_for(lambda: get(port, "/readyz")[0] == 200)
        assert samples(port, "bridge_worker_restarts_total") == {"0": 0, str(victim): 1}
        assert samples(port, "bridge_worker_up") == {"0": 1, "1": 1}
        (route,) = routes(port)
        assert route["workers"] == [
            {"worker": 0, "state": "running"},
            {"worker": 1, "state": "running"},
        ]

        wait_for(lambda: pg_count(pg_schema, src) == 0, timeout=90)
        assert running.stop() == 0  # the killed worker runs again: nothing to report
        assert not is_worker(again) and not is_worker(pids[0])
    log = running.output()
    assert log.count("starting it again") == 1, log
    assert [i for i, _ in running.started()] in ([0, 1, 1], [1, 0, 1])
    assert "Traceback" not in log and SECRET not in log, log
    delivered = take_ids(config, "dst", dst)
    # The killed worker's batch in hand (at most BATCH messages) may arrive twice, no more.
    report(f"pg->pg, --workers 2, worker kill -9 at {at_kill}", sent, delivered, BATCH)


@pytest.mark.timeout(180)
def test_workers_stop_on_their_own_when_the_primary_is_killed_with_9(
    tmp_path: Path, pg_schema: str
) -> None:
    total = 10_000
    src, dst = unique("In"), unique("Out")
    config = write_config(tmp_path / "routes.yaml", pg_schema, src, dst)
    sent = fill(config, "src", src, total)
    with primary(config) as running:
        pids = running.wait_for_workers()
        wait_for(lambda: pg_count(pg_schema, dst) >= total // 10)
        running.process.kill()
        running.process.wait(timeout=30)
        at_kill = pg_count(pg_schema, dst)
        # each notices its end of the socket pair close, finishes its batch and exits
        wait_for(lambda: not any(is_worker(pid) for pid in pids.values()), timeout=15)
    log = running.output()
    for index in (0, 1):
        gone = f"WARNING bridge.workers[worker {index}]: the primary process is gone: stopping"
        assert gone in log, log
        assert f"INFO bridge.route[worker {index}]: route move: running -> stopped" in log, log
    assert "Traceback" not in log and SECRET not in log, log
    left = pg_count(pg_schema, src)
    assert left > 0, "the workers ran on without their primary"
    # what they left behind, moved by a plain `bridge run`
    result = subprocess.run(
        [*BRIDGE, "run", "-c", str(config), "--until-idle", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert pg_count(pg_schema, src) == 0
    # a worker that stops commits its batch in hand: not even a duplicate
    delivered = take_ids(config, "dst", dst)
    report(f"pg->pg, --workers 2, primary kill -9 at {at_kill}", sent, delivered, 0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_until_idle_with_workers_drains_the_queue_and_exits_0(
    tmp_path: Path, database: str, request: pytest.FixtureRequest
) -> None:
    count = 2000
    schema = None if database == "sqlite" else request.getfixturevalue("pg_schema")
    src, dst = unique("In"), unique("Out")
    config = write_config(tmp_path / "routes.yaml", schema, src, dst)
    sent = fill(config, "src", src, count)
    with primary(config, "--until-idle", "1") as running:
        code = running.process.wait(timeout=90)
        log = running.output()
        assert code == 0, log
        assert not [pid for _, pid in running.started() if is_worker(pid)]
    assert sorted(i for i, _ in running.started()) == [0, 1], log  # and none started again
    for index in (0, 1):
        assert f"[worker {index}]: every source idle for 1.0s: stopping" in log, log
    assert "Traceback" not in log and SECRET not in log, log
    assert depth(config, "src", src) == 0
    delivered = take_ids(config, "dst", dst)
    report(f"{database}, --workers 2 --until-idle 1", sent, delivered, 0)


@pytest.mark.timeout(60)
def test_a_sigterm_while_the_workers_start_is_a_clean_stop(tmp_path: Path) -> None:
    """A pod deleted as it starts: the workers may get SIGTERM before they handle it."""
    config = write_config(tmp_path / "routes.yaml", None, "In", "Out")
    with primary(config) as running:
        wait_for(lambda: len(running.workers()) == 2, timeout=30)
        code = running.stop()
        log = running.output()
        assert code == 0, log
        assert not [pid for _, pid in running.started() if is_worker(pid)], log
    assert "Traceback" not in log, log
