"""Many PostgreSQL routes in one process, and one busy one: a bridge checkout before its
connection pool against one with it, on a PostgreSQL server of the bench's own.

    git worktree add /tmp/before <commit before the pool>
    .venv/bin/python bench/pool.py --before /tmp/before                 # both parts
    .venv/bin/python bench/pool.py --before /tmp/before --no-throughput --routes 300

Many routes
    `--routes` (200) PostgreSQL -> PostgreSQL routes (`src:Q_i` -> `dst:Q_i`, two connections
    of one server, each table in a schema of its connection) in one `bridge run` process with
    the product's defaults (the config names no pool setting, so both checkouts run it). For
    `--seconds` (60) from its start: how many times the server refused a connection ("too many
    clients already", from the server's log), the most server connections the bridge held
    (`pg_stat_activity`, by its application names) against what the server allows
    (max_connections - superuser_reserved_connections), and the routes running at the end
    (`/routes`). `--probe-after` (10) seconds in, one message is written into every tenth
    route's source: how many arrive within `--probe-wait` (30) seconds, and the p50 and the
    longest wait of those that did.
Busy route
    `bench/routes.py --routes sql-kafka,kafka-sql --db postgresql --workers 1 --no-legs
    --no-baseline --latency-seconds 0` of each checkout, run from that checkout against the
    same server, `--pairs` (3) times each, alternating (before first in the first pair, after
    first in the second, ...), `--messages` (20,000) each run: msgs/s
    and the bridge's CPU µs/msg, and the median ratio after / before (min-max).
Per transaction
    What the pool adds to one transaction, in this process through this checkout's
    `Connection` (lease, give back, and a receive's `SET LOCAL`), against a connection of its
    own (`overhead`): the cost behind the busy route's numbers, without the route's noise.

The server is a fresh cluster with initdb's defaults (`tests/support/pgserver.py`, which the
TLS tests share; as root it runs as `postgres`), so running it out of connections disturbs
nothing else; it is removed at the end. The bench's own watcher and writer hold two of its
connections.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # `python bench/pool.py`: import bench as a package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "bench"

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field

import psycopg

from bench.machine import machine
from bench.messages import unique
from tests.support.localkafka import free_port
from tests.support.pgserver import PrivateServer

HERE = Path(__file__).resolve().parents[1]

Run = dict[str, dict[str, float]]  # route -> {rate, cpu_us}


def checkout_env() -> dict[str, str]:
    """The environment for a checkout's own `python -m bridge` (its working directory wins)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@dataclass
class ManyRoutes:
    """One checkout's run of many routes."""

    refused: int = 0
    most_held: int = 0
    running: int = 0
    probes: int = 0
    arrived: list[float] = field(default_factory=list)


class Watch(threading.Thread):
    """The most connections the applications hold, sampled every 100 ms."""

    def __init__(self, dsn: str, applications: list[str]) -> None:
        super().__init__(daemon=True)
        self.dsn, self.applications = dsn, applications
        self.most = 0
        self.stop = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as db:
            while not self.stop.is_set():
                row = db.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = ANY(%s)",
                    (self.applications,),
                ).fetchone()
                self.most = max(self.most, int(row[0]) if row else 0)
                self.stop.wait(0.1)


def routes_config(server: PrivateServer, routes: int, port: int, tag: str) -> str:
    lines = [
        f"http: {{host: 127.0.0.1, port: {port}}}",
        "connections:",
        f'  src: {{type: postgresql, dsn: "{server.dsn}", schema: "{tag}_src"}}',
        f'  dst: {{type: postgresql, dsn: "{server.dsn}", schema: "{tag}_dst"}}',
        "routes:",
    ]
    lines += [
        f"  - {{name: r{i:03d}, from: {{connection: src, queue: Q{i:03d}}}, "
        f"to: {{connection: dst, queue: Q{i:03d}}}}}"
        for i in range(routes)
    ]
    return "\n".join(lines) + "\n"


def running_routes(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/routes", timeout=10) as page:
            routes = json.loads(page.read())["routes"]
    except OSError:
        return 0
    return sum(1 for route in routes if route["state"] == "running")


def many_routes(checkout: Path, server: PrivateServer, args: argparse.Namespace) -> ManyRoutes:
    tag = unique("pool")
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "routes.yaml"
        config.write_text(routes_config(server, args.routes, port, tag))
        with psycopg.connect(server.dsn, autocommit=True) as db:
            db.execute(f'CREATE SCHEMA "{tag}_src"; CREATE SCHEMA "{tag}_dst"')
        subprocess.run(
            [sys.executable, "-m", "bridge", "install", "-c", str(config)],
            cwd=HERE,
            env=checkout_env(),
            check=True,
            capture_output=True,
        )
        result = ManyRoutes()
        watch = Watch(server.dsn, ["bridge src", "bridge dst"])
        watch.start()
        writer = psycopg.connect(server.dsn, autocommit=True)  # before the bridge fills the server
        offset = server.log_size()
        log = Path(tmp) / "bridge.log"
        with log.open("wb") as out:
            bridge = subprocess.Popen(
                [sys.executable, "-m", "bridge", "run", "-c", str(config), "--log-level", "ERROR"],
                cwd=checkout,
                env=checkout_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        started = time.monotonic()
        try:
            time.sleep(args.probe_after)
            result.probes, result.arrived = probe(writer, tag, args)
            time.sleep(max(0.0, args.seconds - (time.monotonic() - started)))
            result.running = running_routes(port)
            result.refused = server.refused_since(offset)
        finally:
            bridge.terminate()
            try:
                bridge.wait(timeout=60)
            except subprocess.TimeoutExpired:
                bridge.kill()
                bridge.wait()
            writer.close()
            watch.stop.set()
            watch.join()
            result.most_held = watch.most
            with psycopg.connect(server.dsn, autocommit=True) as db:
                db.execute(f'DROP SCHEMA "{tag}_src" CASCADE; DROP SCHEMA "{tag}_dst" CASCADE')
    return result


def probe(
    db: psycopg.Connection[tuple[object, ...]], tag: str, args: argparse.Namespace
) -> tuple[int, list[float]]:
    """One message into every tenth route's source; the seconds each took to arrive."""
    chosen = list(range(0, args.routes, 10))
    written = time.monotonic()
    for i in chosen:
        db.execute(
            f'INSERT INTO "{tag}_src"."Q{i:03d}" (id, headers, body)'
            " VALUES (gen_random_uuid(), %s, %s)",
            ('{"NServiceBus.MessageId":"probe"}', b"{}"),
        )
    waiting = set(chosen)
    arrived: list[float] = []
    while waiting and time.monotonic() - written < args.probe_wait:
        for i in list(waiting):
            row = db.execute(f'SELECT count(*) FROM "{tag}_dst"."Q{i:03d}"').fetchone()
            if row and row[0]:
                arrived.append(time.monotonic() - written)
                waiting.discard(i)
        time.sleep(0.05)
    return len(chosen), arrived


def routes_run(checkout: Path, dsn: str, messages: int) -> Run:
    """route -> {rate, cpu_us} of one `bench/routes.py` run of `checkout`, from its checkout."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        done = subprocess.run(
            [
                sys.executable,
                str(checkout / "bench" / "routes.py"),
                f"--messages={messages}",
                "--routes=sql-kafka,kafka-sql",
                "--db=postgresql",
                "--workers=1",
                "--no-legs",
                "--no-baseline",
                "--latency-seconds=0",
                f"--dsn={dsn}",
                f"--json={out}",
            ],
            cwd=checkout,
            env=checkout_env(),
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0 or not out.exists():
            raise SystemExit(f"routes.py failed ({done.returncode}):\n{done.stderr[-2000:]}")
        results = json.loads(out.read_text())["results"]
    return {f"{r['route']} {r['db']}": {"rate": r["rate"], "cpu_us": r["cpu_us"]} for r in results}


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f}"


def report_many(results: dict[str, ManyRoutes], allowed: int, args: argparse.Namespace) -> None:
    print(
        f"\n{args.routes} PostgreSQL -> PostgreSQL routes in one process, {args.seconds:.0f} s;"
        f" one message into each of every tenth route's source {args.probe_after:.0f} s in\n"
    )
    print(
        "| bridge | routes running | 'too many clients' a minute | most server connections held"
        " | allowed (max_connections - reserved) | held / allowed | probes arrived"
        f" (within {args.probe_wait:.0f} s) | p50 ms | longest ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        per_minute = r.refused * 60 / args.seconds
        p50 = ms(statistics.median(r.arrived)) if r.arrived else "-"
        longest = ms(max(r.arrived)) if r.arrived else "-"
        print(
            f"| {name} | {r.running} of {args.routes} | {per_minute:,.0f} | {r.most_held} |"
            f" {allowed} | {r.most_held / allowed:.2f} | {len(r.arrived)} of {r.probes} |"
            f" {p50} | {longest} |"
        )


def report_busy(
    pairs: list[tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]],
) -> None:
    print(f"\nOne busy route, {len(pairs)} alternating pairs (after: with the pool)\n")
    print("| route | pair | msgs/s before | msgs/s after | CPU µs/msg before | CPU µs/msg after |")
    print("|---|---|---|---|---|---|")
    for route in pairs[0][0]:
        rates, cpus = [], []
        for i, (before, after) in enumerate(pairs, 1):
            b, a = before[route], after[route]
            rates.append(a["rate"] / b["rate"])
            cpus.append(a["cpu_us"] / b["cpu_us"])
            print(
                f"| {route} | {i} | {b['rate']:,.0f} | {a['rate']:,.0f} | {b['cpu_us']:.1f} |"
                f" {a['cpu_us']:.1f} |"
            )
        print(
            f"| {route} | after / before, median (min-max) | | "
            f"{statistics.median(rates):.3f} ({min(rates):.3f}-{max(rates):.3f}) | | "
            f"{statistics.median(cpus):.3f} ({min(cpus):.3f}-{max(cpus):.3f}) |"
        )


def overhead(dsn: str, rounds: int, calls: int) -> dict[str, tuple[float, float]]:
    """Per transaction (`SELECT 1`, commit) through this checkout's `Connection`, in µs of wall
    and of process CPU (median of `rounds` of `calls`): on a database connection of its own, as
    every source and sink had before the pool; leased from a pool; leased, with the
    receive's `SET LOCAL synchronous_commit = off` before the commit."""
    import asyncio

    from bridge.config.models import PostgresConnection
    from bridge.transports.sql.connection import Connection
    from bridge.transports.sql.dialects.base import DbConnection
    from bridge.transports.sql.dialects.postgresql import PostgresDialect
    from bridge.transports.sql.pool import Pool

    dialect = PostgresDialect("overhead", PostgresConnection(type="postgresql", dsn=dsn))

    def plain(db: DbConnection) -> None:
        db.cursor().execute("SELECT 1")
        db.commit()

    def receive(db: DbConnection) -> None:
        db.cursor().execute("SELECT 1")
        dialect.receiving_transaction(db)
        db.commit()

    async def go() -> dict[str, tuple[float, float]]:
        own = Connection(dialect)
        pool = Pool(dialect.connect, 2, 10.0, "overhead")
        pooled = Connection(dialect, pool=pool, receiving=True)
        variants = {
            "own connection (before)": (own, plain),
            "pooled": (pooled, plain),
            "pooled, with SET LOCAL (after, a receive)": (pooled, receive),
        }
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
        for _ in range(rounds):
            for name, (connection, work) in variants.items():
                wall, cpu = time.perf_counter(), time.process_time()
                for _ in range(calls):
                    await connection.run(work)
                times[name].append(
                    (
                        (time.perf_counter() - wall) / calls * 1e6,
                        (time.process_time() - cpu) / calls * 1e6,
                    )
                )
        await own.close()
        await pooled.close()
        pool.close()
        return {
            name: (statistics.median(w for w, _ in got), statistics.median(c for _, c in got))
            for name, got in times.items()
        }

    return asyncio.run(go())


def report_overhead(found: dict[str, tuple[float, float]], rounds: int, calls: int) -> None:
    print(f"\nOne transaction through a Connection, median of {rounds} rounds of {calls}\n")
    print(
        "| connection | µs a transaction | CPU µs a transaction | CPU µs more than its own"
        " connection | of a message, at 500 a batch |"
    )
    print("|---|---|---|---|---|")
    base = next(iter(found.values()))[1]
    for name, (wall, cpu) in found.items():
        more = cpu - base
        print(f"| {name} | {wall:.0f} | {cpu:.0f} | {more:+.0f} | {more / 500:+.3f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a checkout of the bridge without it")
    parser.add_argument("--after", default=str(HERE), help="a checkout with it (this one)")
    parser.add_argument("--routes", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--probe-after", type=float, default=10.0)
    parser.add_argument("--probe-wait", type=float, default=30.0)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--no-many", action="store_true", help="skip the many-routes part")
    parser.add_argument("--no-throughput", action="store_true", help="skip the busy route")
    parser.add_argument("--no-overhead", action="store_true", help="skip the per-transaction cost")
    parser.add_argument(
        "--pg-bin", help="directory of initdb and pg_ctl (default: PATH, else Debian's newest)"
    )
    args = parser.parse_args()
    before, after = Path(args.before).resolve(), Path(args.after).resolve()
    for key, value in machine().items():
        print(f"{key}: {value}")
    with PrivateServer(args.pg_bin) as server:
        with psycopg.connect(server.dsn) as db:
            row = db.execute(
                "SELECT current_setting('max_connections')::int"
                " - current_setting('superuser_reserved_connections')::int"
            ).fetchone()
        allowed = int(row[0]) if row else 0
        print(f"server: PostgreSQL {server.version()} of its own, {allowed} connections allowed")
        if not args.no_many:
            many = {}
            for name, checkout in (("before", before), ("after", after)):
                many[name] = many_routes(checkout, server, args)
                print(f"  {name}: done", flush=True)
            report_many(many, allowed, args)
        if not args.no_overhead:
            report_overhead(overhead(server.dsn, 9, 2000), 9, 2000)
        if not args.no_throughput:
            pairs = []
            for i in range(args.pairs):  # each pair in the other order: B A, A B, B A ...
                if i % 2:
                    a = routes_run(after, server.dsn, args.messages)
                    b = routes_run(before, server.dsn, args.messages)
                else:
                    b = routes_run(before, server.dsn, args.messages)
                    a = routes_run(after, server.dsn, args.messages)
                pairs.append((b, a))
                print(f"  pair {i + 1} done", flush=True)
            report_busy(pairs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
