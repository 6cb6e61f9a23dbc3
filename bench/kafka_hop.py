"""The Kafka hop alone: latency from a send to a consumer on the local broker (tansu), no route.

    .venv/bin/python bench/kafka_hop.py [--rate 1000] [--seconds 10] [--per-send 4,13] [--runs 2]
                                        [--by-second]

A bridge Kafka sink (its own transport and aiokafka producer, as in `bridge run`) sends
`--rate` messages a second of 1 KB to a fresh topic of 6 partitions, `--per-send` of them per
send (4 and 13 are what SQL -> Kafka sends at 1,000 msg/s from PostgreSQL and from SQLite),
with the route bench's NServiceBus headers, while the route bench's Kafka reader (a consumer
with a 5 ms fetch wait, `KafkaPlace.timed`) takes each message's latency from the time it was
handed to the sink. The first second is a warm-up. Prints a table of p50, p99 and max per
setting and run: what a route into Kafka cannot go below on this machine and broker. Starts
and stops tansu; needs nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from common import body_of, headers_of, percentile, print_table, unique
from places import KafkaPlace

from bridge.devbroker import LocalKafka
from bridge.envelope import Envelope, Headers
from bridge.transports import load

PARTITIONS = 6


async def one_run(bootstrap: str, rate: int, seconds: float, per_send: int) -> list[float]:
    """Latencies (seconds) of the messages after the first second, read as the route bench
    reads a Kafka destination's (`KafkaPlace.timed`)."""
    place = KafkaPlace(unique("hop"), bootstrap, PARTITIONS)
    await place.create()
    transport = load("kafka", place.config)
    sink = transport.sink(place.address, key="header:NServiceBus.MessageId")
    total = int(rate * seconds) // per_send * per_send
    try:
        reader = asyncio.create_task(place.timed(total - rate, time.time(), rate, seconds + 30))
        await asyncio.sleep(1.0)  # the consumer is attached before the first send
        body, sent, started = body_of(1024), 0, time.monotonic()
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
        return await reader
    finally:
        await sink.close()
        await transport.close()
        if place._verify is not None:  # the reader `timed` left open
            await place._verify.stop()
        await place.drop()


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
    args = parser.parse_args()
    rows: list[list[object]] = []
    with LocalKafka() as kafka:
        for run in range(1, args.runs + 1):
            for per_send in (int(n) for n in args.per_send.split(",")):
                found = asyncio.run(
                    one_run(kafka.bootstrap_servers, args.rate, args.seconds, per_send)
                )
                ms = [1000 * value for value in found]
                parts = [("all", ms)]
                if args.by_second:  # in arrival order: `rate` messages are about a second
                    parts += [
                        (str(1 + i // args.rate), ms[i : i + args.rate])
                        for i in range(0, len(ms), args.rate)
                    ]
                rows.extend(
                    [
                        run,
                        per_send,
                        args.rate,
                        second,
                        f"{percentile(part, 50):.1f}",
                        f"{percentile(part, 99):.1f}",
                        f"{max(part):.1f}",
                    ]
                    for second, part in parts
                )
    print_table(["run", "per send", "msgs/s", "second", "p50 ms", "p99 ms", "max ms"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
