"""The Kafka hop alone: latency from a send to a consumer on the local broker (tansu), no route.

    .venv/bin/python bench/kafka_hop.py [--rate 1000] [--seconds 10] [--per-send 4,13] [--runs 2]
                                        [--by-second] [--no-reader]

A bridge Kafka sink (its own transport and aiokafka producer, as in `bridge run`) sends
`--rate` messages a second of 1 KB to a fresh topic of 6 partitions, `--per-send` of them per
send (13 is about what a SQL -> Kafka route sends at 1,000 msg/s, its source waiting 10 ms
between polls once caught up; 4 is a source that polls again at once), with the route bench's
NServiceBus headers, while the route bench's Kafka reader (a consumer with a 5 ms fetch wait,
`KafkaPlace.timed`) takes each message's latency from the time it was handed to the sink.
The first second is a warm-up. Prints a table of p50, p99 and max per setting and run
(`--by-second`: and per second): what a route into Kafka cannot go below on this machine and
broker. Each row also has tansu's CPU, a share of one core: its fetches cost
more the more record batches a partition holds, so with small sends and a reader it climbs
second by second, and the latency with it (`--no-reader`: the same sends, nobody fetching).
Starts and stops tansu; needs nothing else.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # `python bench/kafka_hop.py`: import bench as a package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import math
import time

from bench.legs import KafkaPlace
from bench.machine import ProcessCpuSampler
from bench.messages import body_of, headers_of, unique
from bench.report import percentile, print_table
from bridge.envelope import Envelope, Headers
from bridge.transports import load
from tests.support.localkafka import LocalKafka

PARTITIONS = 6


async def one_run(
    bootstrap: str, rate: int, seconds: float, per_send: int, broker: int, read: bool = True
) -> tuple[list[float], list[float]]:
    """Latencies (seconds) of the messages after the first second, read as the route bench
    reads a Kafka destination's (`KafkaPlace.timed`; none when not `read`), and the broker's
    (process `broker`) CPU in each second of sending, as a share of one core."""
    place = KafkaPlace(unique("hop"), bootstrap, PARTITIONS)
    await place.create()
    transport = load("kafka", place.config)
    sink = transport.sink(place.address, key="header:NServiceBus.MessageId")
    total = int(rate * seconds) // per_send * per_send
    try:
        reader = None
        if read:
            expected = total - rate
            reader = asyncio.create_task(place.timed(expected, time.time(), rate, seconds + 30))
        await asyncio.sleep(1.0)  # the consumer is attached before the first send
        body, sent, started = body_of(1024), 0, time.monotonic()
        with ProcessCpuSampler(broker) as cpu:
            while sent < total:
                due = int((time.monotonic() - started) * rate) + per_send - sent
                if due < per_send:
                    await asyncio.sleep(0.0005)
                    continue
                now = time.time()
                await sink.send(
                    [
                        Envelope(Headers(headers_of(sent + i, now).items()), body)
                        for i in range(per_send)
                    ]
                )
                sent += per_send
        return (await reader if reader is not None else []), cpu.shares
    finally:
        await sink.close()
        await transport.close()
        if place._verify is not None:  # the reader `timed` left open
            await place._verify.stop()
        await place.drop()


def at(values: list[float], index: int) -> float:
    return values[index] if index < len(values) else math.nan


def spread(ms: list[float]) -> list[str]:
    """p50, p99 and max cells; dashes when nothing was read."""
    if not ms:
        return ["-", "-", "-"]
    return [f"{percentile(ms, 50):.1f}", f"{percentile(ms, 99):.1f}", f"{max(ms):.1f}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rate", type=int, default=1000, help="messages a second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--per-send", default="4,13", help="messages per send, comma-separated")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument(
        "--by-second",
        action="store_true",
        help="a row for each second of each run too (does the latency grow with the topic?)",
    )
    parser.add_argument(
        "--no-reader",
        action="store_true",
        help="send only, nobody fetching: the broker's CPU without a consumer",
    )
    args = parser.parse_args()
    rows: list[list[object]] = []
    with LocalKafka() as kafka:
        for run in range(1, args.runs + 1):
            for per_send in (int(n) for n in args.per_send.split(",")):
                found, cpu = asyncio.run(
                    one_run(
                        kafka.bootstrap_servers,
                        args.rate,
                        args.seconds,
                        per_send,
                        kafka.pid,
                        read=not args.no_reader,
                    )
                )
                ms = [1000 * value for value in found]
                measured = cpu[1:]  # the first second is the warm-up
                parts = [("all", ms, sum(measured) / len(measured) if measured else math.nan)]
                if args.by_second:  # in arrival order: `rate` messages are about a second
                    seconds = max(len(measured), math.ceil(len(ms) / args.rate))
                    parts += [
                        (str(1 + i), ms[i * args.rate : (i + 1) * args.rate], at(measured, i))
                        for i in range(seconds)
                    ]
                rows.extend(
                    [run, per_send, args.rate, second, *spread(part), f"{share:.0%}"]
                    for second, part, share in parts
                )
    head = ["run", "per send", "msgs/s", "second", "p50 ms", "p99 ms", "max ms", "tansu CPU"]
    print_table(head, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
