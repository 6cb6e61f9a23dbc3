"""Does the local Kafka broker (tansu) keep every record two producers write at the same time?

    .venv/bin/python bench/tansu_producers.py --producers 2 --runs 3

Each producer is a bridge Kafka sink of its own transport (its own aiokafka producer, as each
worker of `bridge run --workers 2` has) sending `--batches` batches of `--messages` envelopes
with unique `NServiceBus.MessageId`s to one topic of 6 partitions; every send returned, i.e.
the broker acknowledged every record (acks=all). A reader then counts the distinct ids in the
topic. No database is involved: a shortfall is the broker's. Prints a line per run; exits 1
when a run read fewer ids than were acknowledged.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # `python bench/tansu_producers.py`: import bench as a package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio

from bench.legs import KafkaPlace
from bench.messages import unique
from bridge.envelope import Envelope, Headers
from bridge.transports import load
from tests.support.localkafka import LocalKafka


async def write(place: KafkaPlace, name: str, batches: int, messages: int) -> int:
    transport = load("kafka", place.config)
    sink = transport.sink(place.address, key="header:NServiceBus.MessageId")
    try:
        for b in range(batches):
            await sink.send(
                [
                    Envelope(Headers([("NServiceBus.MessageId", f"{name}-{b}-{i}")]), b"x" * 1024)
                    for i in range(messages)
                ]
            )
    finally:
        await sink.close()
        await transport.close()
    return batches * messages


async def one_run(bootstrap: str, args: argparse.Namespace) -> int:
    place = KafkaPlace(unique("tansu"), bootstrap, 6)
    await place.create()
    try:
        writers = (
            write(place, f"p{j}", args.batches, args.messages) for j in range(args.producers)
        )
        acknowledged = sum(await asyncio.gather(*writers))
        records, ids = await place.drain_all(acknowledged, 20)
        print(
            f"{args.producers} producer(s): {acknowledged} acknowledged, {records} read, "
            f"{acknowledged - ids} missing",
            flush=True,
        )
        return acknowledged - ids
    finally:
        if place._verify is not None:  # the reader drain_all left open
            await place._verify.stop()
        await place.drop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--messages", type=int, default=100, help="per batch")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with LocalKafka() as kafka:
        missing = [asyncio.run(one_run(kafka.bootstrap_servers, args)) for _ in range(args.runs)]
    return 1 if any(missing) else 0


if __name__ == "__main__":
    sys.exit(main())
