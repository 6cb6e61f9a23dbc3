"""The Kafka hop alone: latency from a send to a consumer on the local broker (tansu), no route.

    .venv/bin/python bench/kafka_hop.py [--rate 1000] [--seconds 10] [--per-send 4,13] [--runs 2]

A bridge Kafka sink (its own transport and aiokafka producer, as in `bridge run`) sends
`--rate` messages a second of 1 KB to a fresh topic of 6 partitions, `--per-send` of them per
send (4 and 13 are what SQL -> Kafka sends at 1,000 msg/s from PostgreSQL and from SQLite),
while a consumer reads the topic with the 5 ms fetch wait the route bench's consumer uses. Each
message carries the time it was handed to the sink; the consumer takes its latency when
`getmany` returns it. The first second is a warm-up. Prints a table of p50, p99 and max per
setting and run: what a route into Kafka cannot go below on this machine and broker. Starts
and stops tansu; needs nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from aiokafka import AIOKafkaConsumer, TopicPartition
from common import percentile, print_table, unique
from places import KafkaPlace

from bridge.devbroker import LocalKafka
from bridge.envelope import Envelope, Headers
from bridge.transports import load

PARTITIONS = 6
SENT_AT = "Bench.SentAt"


async def one_run(bootstrap: str, rate: int, seconds: float, per_send: int) -> list[float]:
    """Latencies (seconds) of the messages after the first second."""
    place = KafkaPlace(unique("hop"), bootstrap, PARTITIONS)
    await place.create()
    transport = load("kafka", place.config)
    sink = transport.sink(place.address, key="header:NServiceBus.MessageId")
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        fetch_max_wait_ms=5,
        enable_auto_commit=False,
        max_partition_fetch_bytes=1_048_576,
    )
    await consumer.start()
    total = int(rate * seconds) // per_send * per_send
    latencies: list[float] = []
    try:
        partitions = [TopicPartition(place.address, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        await consumer.seek_to_end(*partitions)

        async def read() -> None:
            while len(latencies) < total:
                fetched = await consumer.getmany(timeout_ms=100, max_records=5000)
                now = time.time()
                for records in fetched.values():
                    for record in records:
                        sent_at = float(dict(record.headers)[SENT_AT].decode())
                        latencies.append(now - sent_at)

        reader = asyncio.create_task(read())
        await asyncio.sleep(1.0)  # the consumer has its positions
        body, sent, started = b"x" * 1024, 0, time.monotonic()
        while sent < total:
            due = int((time.monotonic() - started) * rate) + per_send - sent
            if due < per_send:
                await asyncio.sleep(0.0005)
                continue
            now = repr(time.time())
            await sink.send(
                [
                    Envelope(
                        Headers([("NServiceBus.MessageId", f"m{sent + i}"), (SENT_AT, now)]), body
                    )
                    for i in range(per_send)
                ]
            )
            sent += per_send
        await asyncio.wait_for(reader, 30)
    finally:
        await consumer.stop()
        await sink.close()
        await transport.close()
        await place.drop()
    return latencies[rate:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rate", type=int, default=1000, help="messages a second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--per-send", default="4,13", help="messages per send, comma-separated")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    rows = []
    with LocalKafka() as kafka:
        for run in range(1, args.runs + 1):
            for per_send in (int(n) for n in args.per_send.split(",")):
                found = asyncio.run(
                    one_run(kafka.bootstrap_servers, args.rate, args.seconds, per_send)
                )
                ms = [1000 * value for value in found]
                rows.append(
                    [
                        run,
                        per_send,
                        args.rate,
                        f"{percentile(ms, 50):.1f}",
                        f"{percentile(ms, 99):.1f}",
                        f"{max(ms):.1f}",
                    ]
                )
    print_table(["run", "per send", "msgs/s", "p50 ms", "p99 ms", "max ms"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
