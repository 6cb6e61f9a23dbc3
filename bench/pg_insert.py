"""The bridge's PostgreSQL sink alone, by batch size: one pipelined `executemany` per send
against the staged send (a binary COPY into the session's temporary table, then one
INSERT ... SELECT), which the sink uses from `STAGE_FROM` rows a send.

    .venv/bin/python bench/pg_insert.py [--sizes 1,4,16,32,64,128,256,500] [--rounds 2]

For each batch size and round, the same 1 KB messages with the NServiceBus headers the route
bench sends go through `SqlSink.send` into a fresh queue table, once each way, alternating;
each send is its own transaction, as in a route. Prints msgs/s, milliseconds per send and the
CPU this process spent per message (the sink's layout, the driver; the server's work is not
in it). Needs PostgreSQL on 127.0.0.1 (`BRIDGE_TEST_PG_DSN`); every table is removed at the
end.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # `python bench/pg_insert.py`: import bench as a package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import time
from typing import cast

import psycopg

from bench.legs import PG_DSN
from bench.messages import body_of, headers_of, unique
from bench.report import print_table
from bridge.config.models import PostgresConnection
from bridge.envelope import Envelope, Headers
from bridge.transports import load
from bridge.transports.sql import Transport as SqlTransport
from bridge.transports.sql import sink as sink_module

#: Messages per measurement: enough sends of small batches to average over.
MESSAGES = 4000


async def measure(transport: SqlTransport, size: int, staged: bool) -> tuple[float, float, float]:
    """(msgs/s, ms per send, CPU µs per message) for sends of `size` messages."""
    name = unique("pginsert")
    await transport.install([name])
    count = max(size, MESSAGES // size * size)
    body, now = body_of(1024), time.time()
    envelopes = [Envelope(Headers(headers_of(i, now).items()), body) for i in range(count)]
    sink_module.STAGE_FROM = 1 if staged else count + 1
    sink = transport.sink(name)
    try:
        await sink.send(envelopes[:size])  # connect (and create the stage) before the clock
        started, cpu = time.perf_counter(), time.process_time()
        for first in range(0, count, size):
            await sink.send(envelopes[first : first + size])
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    finally:
        await sink.close()
    return count / seconds, 1000 * seconds / (count / size), 1e6 * cpu / count


async def run(dsn: str, sizes: list[int], rounds: int) -> list[list[object]]:
    schema = unique("bench_pginsert").lower()
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(f'CREATE SCHEMA "{schema}"')
    config = PostgresConnection.model_validate({"type": "postgresql", "dsn": dsn, "schema": schema})
    transport = cast(SqlTransport, load("bench", config))
    stage_from = sink_module.STAGE_FROM
    rows: list[list[object]] = []
    try:
        for round_ in range(1, rounds + 1):
            for size in sizes:
                for staged in (False, True):
                    rate, per_send, cpu = await measure(transport, size, staged)
                    way = "staged (COPY)" if staged else "executemany"
                    rows.append([round_, size, way, f"{rate:,.0f}", f"{per_send:.3f}", cpu])
    finally:
        sink_module.STAGE_FROM = stage_from
        await transport.close()
        with psycopg.connect(dsn, autocommit=True) as db:
            db.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="1,4,16,32,64,128,256,500", help="messages per send")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dsn", default=PG_DSN)
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    rows = asyncio.run(run(args.dsn, sizes, args.rounds))
    print(f"STAGE_FROM (the sink's threshold): {sink_module.STAGE_FROM}")
    print_table(["round", "per send", "insert", "msgs/s", "ms per send", "CPU µs/msg"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
