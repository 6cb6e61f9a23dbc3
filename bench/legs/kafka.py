"""A Kafka topic on the local broker, written and read with aiokafka."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner

from bench.legs.place import PACE_WAIT, Place, chunks, pacing
from bench.messages import NUMBER, WRITTEN_AT, Message, body_of, headers_of, unique
from bridge.config.models import KafkaConnection
from bridge.envelope import Envelope, Headers
from bridge.transports import load
from bridge.transports.kafka.headers import outgoing

__all__ = ["DEFAULT_PARTITIONS", "KafkaPlace"]

#: Partitions of a topic `bridge install` creates, unless the connection says otherwise.
DEFAULT_PARTITIONS: int = KafkaConnection.model_fields["partitions"].default


class KafkaPlace(Place):
    """A topic of `partitions` partitions on the local broker."""

    kind = "kafka"
    connection = "kafka"

    def __init__(self, address: str, bootstrap: str, partitions: int = DEFAULT_PARTITIONS) -> None:
        super().__init__(address)
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.config = KafkaConnection(
            type="kafka",
            bootstrap_servers=bootstrap,
            idempotence=False,
            session_timeout_ms=3000,
            partitions=partitions,
        )
        self._verify: AIOKafkaConsumer | None = None

    def connection_yaml(self) -> str:
        return (
            f"{{type: kafka, bootstrap_servers: {json.dumps(self.bootstrap)}, "
            f"idempotence: false, session_timeout_ms: 3000, partitions: {self.partitions}}}"
        )

    def endpoint_yaml(self, role: str, group: str = "") -> str:
        if role == "from":
            return f"{{connection: kafka, topic: {self.address}, group: {group}}}"
        return f"{{connection: kafka, topic: {self.address}}}"

    async def create(self) -> None:
        transport = load("bench", self.config)
        await transport.install([self.address])
        await transport.close()

    async def drop(self) -> None:
        if self._verify is not None:
            await self._verify.stop()
            self._verify = None
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            with contextlib.suppress(Exception):  # the broker goes away at the end anyway
                await admin.delete_topics([self.address])
        finally:
            await admin.close()

    def producer(self, linger_ms: int = 0) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks="all",
            enable_idempotence=False,
            linger_ms=linger_ms,
            max_batch_size=1_048_576,
            max_request_size=1_048_576,
        )

    def consumer(self, group: str | None, fetch_max_wait_ms: int = 500) -> AIOKafkaConsumer:
        # tansu answers a fetch only when fetch_max_wait_ms has passed, even when records
        # arrived before: the latency consumer asks often, so it measures the route, not itself.
        return AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            fetch_max_wait_ms=fetch_max_wait_ms,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=1_048_576,
            session_timeout_ms=3000,
            heartbeat_interval_ms=1000,
        )

    @staticmethod
    def records(messages: Sequence[Message]) -> list[Any]:
        now = time.time()
        return [
            outgoing(Envelope(Headers(h.items()), body), "header:NServiceBus.MessageId", now)
            for h, body in messages
        ]

    async def write(self, messages: Sequence[Message], batch: int) -> float:
        """One closed record batch per partition and window, each window acknowledged
        (acks=all) before the next: the most a producer does with `batch` in flight."""
        records = self.records(messages)
        producer = self.producer()
        await producer.start()
        try:
            partitions = sorted(await producer.partitions_for(self.address))
            partitioner = DefaultPartitioner()
            started = time.perf_counter()
            for chunk in chunks(records, batch):
                builders: dict[int, Any] = {}
                for record in chunk:
                    partition = partitioner(record.key, partitions, partitions)
                    builder = builders.get(partition)
                    if builder is None:
                        builder = builders[partition] = producer.create_batch()
                    builder.append(
                        key=record.key,
                        value=record.value,
                        timestamp=record.timestamp_ms,
                        headers=record.headers,
                    )
                futures = []
                for partition, builder in builders.items():
                    builder.close()
                    futures.append(
                        await producer.send_batch(builder, self.address, partition=partition)
                    )
                await asyncio.gather(*futures)
            return time.perf_counter() - started
        finally:
            await producer.stop()

    async def read(self, count: int, batch: int) -> float:
        """A group consumer taking `batch` records at a time, committing each batch."""
        consumer = self.consumer(unique("bench-read"))
        await consumer.start()
        consumer.subscribe([self.address])
        try:
            got, started = 0, 0.0
            while got < count:
                fetched = await consumer.getmany(timeout_ms=1000, max_records=batch)
                n = sum(len(r) for r in fetched.values())
                if n and not started:
                    started = time.perf_counter()
                got += n
                if fetched:
                    await consumer.commit(
                        {tp: records[-1].offset + 1 for tp, records in fetched.items()}
                    )
            return time.perf_counter() - started
        finally:
            await consumer.stop()

    async def drain_all(self, minimum: int, timeout: float) -> tuple[int, int]:
        """Read the topic from its start until at least `minimum` records are seen and no more
        come: (records, distinct message ids). The consumer stays at the end for `timed`."""
        if self._verify is None:
            self._verify = self.consumer(None, fetch_max_wait_ms=5)
            await self._verify.start()
            tps = [TopicPartition(self.address, p) for p in range(self.partitions)]
            self._verify.assign(tps)
            await self._verify.seek_to_beginning(*tps)
        records, ids = 0, set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fetched = await self._verify.getmany(timeout_ms=500, max_records=5000)
            if not fetched and records >= minimum:
                break
            for batch in fetched.values():
                records += len(batch)
                for record in batch:
                    ids.add(dict(record.headers).get("NServiceBus.MessageId"))
        return records, len(ids)

    async def paced(self, rate: float, seconds: float, size: int) -> int:
        body = body_of(size)
        producer = self.producer(linger_ms=0)
        await producer.start()
        try:
            sent, pending = 0, []
            for before, due in pacing(rate, seconds):
                if not due:
                    await asyncio.sleep(PACE_WAIT)
                    continue
                now = time.time()
                for record in self.records(
                    [(headers_of(before + i, now), body) for i in range(due)]
                ):
                    pending.append(
                        await producer.send(
                            self.address, record.value, key=record.key, headers=record.headers
                        )
                    )
                sent += due
            await asyncio.gather(*pending)
            return sent
        finally:
            await producer.stop()

    async def timed(self, expected: int, since: float, first: int, timeout: float) -> list[float]:
        if self._verify is None:
            await self.drain_all(0, 1.0)
        consumer = self._verify
        assert consumer is not None
        latencies: list[float] = []
        deadline = time.monotonic() + timeout
        while len(latencies) < expected and time.monotonic() < deadline:
            fetched = await consumer.getmany(timeout_ms=100, max_records=5000)
            now = time.time()
            for batch in fetched.values():
                for record in batch:
                    headers = dict(record.headers)
                    written = float(headers[WRITTEN_AT])
                    if written >= since and int(headers[NUMBER]) >= first:
                        latencies.append(now - written)
                        self.arrivals.append(now)
        return latencies
