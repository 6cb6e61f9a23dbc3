"""Bulk move of a PostgreSQL queue table: `bridge migrate` against `bridge run`.

    .venv/bin/python bench/migrate_vs_run.py [--rows 200000] [--size 1024] [--master local[2]]
                                             [--to postgresql|kafka]

Fills a fresh schema's `Source` table with `--rows` messages of `--size` body bytes (batched raw
inserts, NServiceBus-shaped headers), moves them to `Target` with each command in turn (the
same route, refilled in between) and prints a table: rows, seconds (wall clock of the whole
command, Spark start-up included), msgs/s and the ratio to `bridge run`. `Target` is another
table of the same database (`--to postgresql`, each batch one transaction) or a topic on a
local Kafka broker (`--to kafka`, the typical migration; tansu is started and stopped here).
`bridge run --until-idle N` only exits after N idle seconds; those are taken off its time. The
schema is dropped at the end. Needs PostgreSQL (`--dsn`, default the tests' database) and
PySpark.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # `python bench/migrate_vs_run.py`: import bench as a package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import contextlib
import json
import re
import subprocess
import tempfile
import time
import uuid

import psycopg
from aiokafka import AIOKafkaConsumer, TopicPartition

from bench.legs import PG_DSN
from tests.support.localkafka import LocalKafka

IDLE = 2.0


def headers(n: int) -> str:
    message_id = str(uuid.uuid4())
    return json.dumps(
        {
            "NServiceBus.MessageId": message_id,
            "NServiceBus.MessageIntent": "Send",
            "NServiceBus.ConversationId": str(uuid.uuid4()),
            "NServiceBus.CorrelationId": message_id,
            "NServiceBus.OriginatingEndpoint": "Bench",
            "NServiceBus.OriginatingMachine": "bench",
            "NServiceBus.ContentType": "application/json",
            "NServiceBus.EnclosedMessageTypes": "Bench.Ping, Bench.Messages",
            "NServiceBus.TimeSent": "2026-04-29 21:56:55:590807 Z",
            "n": str(n),
        },
        separators=(",", ":"),
    ).replace("/", "\\/")


def fill(dsn: str, schema: str, rows: int, size: int, chunk: int = 5000) -> float:
    body = (b"0123456789abcdef" * (size // 16 + 1))[:size]
    statement = (
        f'INSERT INTO "{schema}"."Source" (id, expires, headers, body) VALUES (%s, NULL, %s, %s)'
    )
    started = time.monotonic()
    with psycopg.connect(dsn) as db:
        for start in range(0, rows, chunk):
            with db.cursor() as cursor:
                cursor.executemany(
                    statement,
                    [
                        (str(uuid.uuid4()), headers(n), body)
                        for n in range(start, min(rows, start + chunk))
                    ],
                )
            db.commit()
    return time.monotonic() - started


def count(dsn: str, schema: str, table: str) -> int:
    with psycopg.connect(dsn) as db:
        row = db.execute(f'SELECT count(*) FROM "{schema}"."{table}"').fetchone()
    return int(row[0]) if row else 0


def records(bootstrap: str, topic: str, idle: float = 2.0) -> int:
    """Records in `topic`, read from the start until none came for `idle` seconds (the local
    broker's end offsets can trail what it holds, so they are not counted on)."""

    async def total() -> int:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            await consumer.topics()
            partitions = consumer.partitions_for_topic(topic) or set()
            assigned = [TopicPartition(topic, p) for p in partitions]
            consumer.assign(assigned)
            await consumer.seek_to_beginning(*assigned)
            seen, quiet_since = 0, time.monotonic()
            while time.monotonic() - quiet_since < idle:
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    seen += len(batch)
                    quiet_since = time.monotonic()
            return seen
        finally:
            await consumer.stop()

    return asyncio.run(total())


def bridge(config: Path, *args: str) -> tuple[float, str]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "bridge", *args, "-c", str(config), "--log-level", "WARNING"],
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        sys.exit(f"bridge {args[0]} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return elapsed, result.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024, help="body bytes")
    parser.add_argument("--dsn", default=PG_DSN)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--partitions", type=int, help="migrate ranges (default 4 x cores)")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=2, help="loops of `bridge run`")
    parser.add_argument(
        "--to", choices=("postgresql", "kafka"), default="postgresql", help="where Target is"
    )
    args = parser.parse_args()

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.dsn, autocommit=True) as db:
        db.execute(f'CREATE SCHEMA "{schema}"')
    workdir = Path(tempfile.mkdtemp(prefix="bridge-bench-"))
    config = workdir / "routes.yaml"
    with contextlib.ExitStack() as stack:
        kafka = stack.enter_context(LocalKafka()) if args.to == "kafka" else None
        connections = f'  pg: {{type: postgresql, dsn: "{args.dsn}", schema: "{schema}"}}\n'
        target = "{connection: pg, queue: Target}"
        if kafka is not None:
            connections += (
                f'  kafka: {{type: kafka, bootstrap_servers: "{kafka.bootstrap_servers}", '
                "idempotence: false}\n"
            )
            target = "{connection: kafka, topic: Target}"
        config.write_text(
            f"connections:\n{connections}"
            "routes:\n"
            "  - name: bench\n"
            "    from: {connection: pg, queue: Source}\n"
            f"    to: {target}\n"
            f"    batch_size: {args.batch_size}\n"
            f"    concurrency: {args.concurrency}\n"
        )
        results = run_both(args, config, schema, kafka)
    print_table(args, results)
    return 0


def run_both(
    args: argparse.Namespace, config: Path, schema: str, kafka: LocalKafka | None
) -> list[tuple[str, float, str]]:
    """Time `bridge migrate`, then `bridge run`, each on a freshly filled Source."""

    def delivered() -> int:
        if kafka is None:
            return count(args.dsn, schema, "Target")
        return records(kafka.bootstrap_servers, "Target")

    results: list[tuple[str, float, str]] = []
    try:
        bridge(config, "install")
        migrate = ["migrate", "--route", "bench", "--master", args.master]
        if args.partitions:
            migrate += ["--partitions", str(args.partitions)]
        for label, command, idle in (
            (f"bridge migrate ({args.master})", migrate, 0.0),
            (
                f"bridge run --until-idle (concurrency {args.concurrency})",
                ["run", "--route", "bench", "--until-idle", str(IDLE)],
                IDLE,
            ),
        ):
            if kafka is None:
                with psycopg.connect(args.dsn, autocommit=True) as db:
                    db.execute(f'TRUNCATE "{schema}"."Target"')
            before = delivered()
            filled = fill(args.dsn, schema, args.rows, args.size)
            print(f"filled {args.rows} rows of {args.size} B in {filled:.1f} s", file=sys.stderr)
            elapsed, out = bridge(config, *command)
            moved = delivered() - before
            left = count(args.dsn, schema, "Source")
            if moved != args.rows or left:
                sys.exit(f"{label}: moved {moved} of {args.rows}, {left} left in the source")
            inner = re.search(r"seconds\s+([\d.]+)", out)
            note = (
                f"moving {float(inner.group(1)):.1f} s" if inner else f"idle wait {idle:.0f} s off"
            )
            results.append((label, elapsed - idle, note))
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as db:
            db.execute(f'DROP SCHEMA "{schema}" CASCADE')
    return results


def print_table(args: argparse.Namespace, results: list[tuple[str, float, str]]) -> None:
    run_seconds = results[-1][1]
    head = ("command", "rows", "body B", "seconds", "msgs/s", "ratio")
    print(f"\nPostgreSQL -> {'Kafka' if args.to == 'kafka' else 'PostgreSQL (one database)'}")
    print("{:<44} {:>8} {:>7} {:>8} {:>8} {:>6}  note".format(*head))
    for label, seconds, note in results:
        rate = args.rows / seconds
        ratio = run_seconds / seconds
        row = (label, args.rows, args.size, seconds, rate, ratio, note)
        print("{:<44} {:>8} {:>7} {:>8.1f} {:>8.0f} {:>6.2f}  {}".format(*row))
    print("\nratio: how many times faster than `bridge run` (wall clock, Spark start-up included)")


if __name__ == "__main__":
    raise SystemExit(main())
