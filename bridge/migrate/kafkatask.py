"""One Spark task of a migration from a Kafka topic: a partition's offset range -> SQL.

`PartitionSource` reads one partition from `start` up to (not including) `end` with a manually
assigned consumer (no group membership, no Kafka commits) and hands out batches whose
`checkpoint` is the partition's next offset under the service's name for it
(`group/topic/partition`, `bridge.transports.kafka.source.checkpoint_key`). The destination,
a SQL queue table's `SqlSink`, stores that position in the same transaction as the rows, so
the move is exactly-once: a retried task starts from the stored position, not from where the
driver planned, and a second run finds nothing left. Records are decoded with the Kafka
transport's own codec (`headers.incoming`); a record whose headers are not UTF-8 is poison
and is copied, before its batch is handed out, to the route's error topic on the Kafka
connection, as the service does (`headers.error_record`); so is, at commit, a message the
destination refused for good. Records at or past `end` are left to the service.

Two attempts of one task may run at once (Spark speculation, or a zombie attempt on an
executor the driver gave up on). The sink's checkpoint writes are fenced
(`SqlSink.fence_checkpoint`): each stores the partition's position only over the one the
attempt read at its start, then over its own last one. The attempt that finds another's
position there rolls back its batch and fails with `RangeTakenOver`, which is not retried
within the task; the rows are written once.
"""

from __future__ import annotations

import time
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from bridge.batch import Batch, Rejected
from bridge.errors import ConfigError, TransportError, TransportUnavailable
from bridge.migrate.bounded import Moved, run_task, run_until_exhausted
from bridge.migrate.spec import JobSpec
from bridge.transports import load
from bridge.transports.kafka import Transport as KafkaTransport
from bridge.transports.kafka.config import KafkaConnection
from bridge.transports.kafka.connection import consumer_kwargs
from bridge.transports.kafka.deadletter import ErrorTopic
from bridge.transports.kafka.errors import translated
from bridge.transports.kafka.headers import read_records
from bridge.transports.kafka.source import checkpoint_key
from bridge.transports.sql.queue import CheckpointConflict, SqlSink

__all__ = [
    "PartitionSource",
    "RangeTakenOver",
    "kafka_task",
    "move_partition",
    "partition_offsets",
]

#: Longest wait for a record the end offset says is there before the task fails (retried).
STALL_SECONDS = 60.0


class RangeTakenOver(TransportError):
    """Another attempt of this task stored the partition's position first (not retriable)."""


async def partition_offsets(config: KafkaConnection, topic: str) -> dict[int, tuple[int, int]]:
    """{partition: (beginning offset, end offset)} of `topic`; TransportError when missing."""
    consumer = AIOKafkaConsumer(**consumer_kwargs(config, None))
    with translated(f"read the offsets of topic {topic!r}"):
        await consumer.start()
        try:
            if topic not in await consumer.topics():
                raise TransportError(f"kafka: no topic {topic!r} (run `bridge install`)")
            tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
            begin = await consumer.beginning_offsets(tps)
            end = await consumer.end_offsets(tps)
        finally:
            await consumer.stop()
    return {tp.partition: (int(begin[tp]), int(end[tp])) for tp in tps}


class PartitionSource:
    """A `Source` over offsets start..end-1 of one partition (see the module docstring)."""

    def __init__(
        self,
        transport: KafkaTransport,
        *,
        topic: str,
        partition: int,
        start: int,
        end: int,
        group: str,
        error_queue: str,
    ) -> None:
        self._transport = transport
        self._tp = TopicPartition(topic, partition)
        self._next = start
        self._end = end
        self._key = checkpoint_key(group, topic, partition)
        self._consumer: Any = None
        config = transport.config
        self._errors = ErrorTopic(transport.producer, error_queue, topic, config.max_request_size)

    async def receive_batch(self, max_messages: int, timeout: float) -> Batch:
        records = await self._fetch(max_messages)
        if not records:
            return Batch()
        first, after = records[0].offset, records[-1].offset + 1
        messages, poison = read_records(records)
        try:
            await self._errors.copy_poison(poison)
        except BaseException:
            self._consumer.seek(self._tp, first)
            raise
        self._next = after
        rejected: list[Rejected] = []

        async def commit() -> None:
            if rejected:
                await self._errors.dead_letter(rejected)

        async def abort() -> None:
            self._next = first
            self._consumer.seek(self._tp, first)

        return Batch(
            messages,
            poison=[copy for _, copy in poison],
            checkpoint={self._key: after},
            on_commit=commit,
            on_abort=abort,
            rejected=rejected,
        )

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with translated(f"close the consumer of {self._tp.topic}/{self._tp.partition}"):
                await consumer.stop()

    async def _fetch(self, max_messages: int) -> list[Any]:
        """The next records below `end`; none once the range is done."""
        if self._next >= self._end:
            return []
        consumer = await self._started()
        waited_since = time.monotonic()
        while True:
            wanted = min(max_messages, self._end - self._next)
            with translated(f"fetch from {self._tp.topic}/{self._tp.partition}"):
                fetched = await consumer.getmany(self._tp, timeout_ms=500, max_records=wanted)
                records = [r for r in fetched.get(self._tp, []) if r.offset < self._end]
                if records:
                    return records
                # Offsets may have gaps (compaction, transaction markers): ask where we are.
                position = await consumer.position(self._tp)
            if position >= self._end:
                self._next = self._end
                return []
            if time.monotonic() - waited_since > STALL_SECONDS:
                raise TransportUnavailable(
                    f"kafka: no records from {self._tp.topic}/{self._tp.partition} at offset "
                    f"{position} for {STALL_SECONDS:.0f} s (end offset {self._end})"
                )

    async def _started(self) -> Any:
        if self._consumer is None:
            consumer = AIOKafkaConsumer(**consumer_kwargs(self._transport.config, None))
            try:
                with translated(f"start a consumer for {self._tp.topic}/{self._tp.partition}"):
                    await consumer.start()
                    consumer.assign([self._tp])
                    consumer.seek(self._tp, self._next)
            except BaseException:
                await consumer.stop()
                raise
            self._consumer = consumer
        return self._consumer


async def move_partition(
    spec: JobSpec, partition: int, start: int, end: int, *, fail_after: int | None = None
) -> Moved:
    """Move offsets start..end-1 of one partition of the route's topic into its SQL table,
    resuming from the position stored with the rows when that is further on."""
    config, route = spec.load()
    source_name, sink_name = route.from_.connection, route.to.connection
    kafka = load(source_name, config.connections[source_name])
    sql = load(sink_name, config.connections[sink_name])
    try:
        if not isinstance(kafka, KafkaTransport) or route.from_.group is None:
            raise ConfigError(f"route {route.name}: its source is not a Kafka topic and group")
        sink = sql.sink(route.to.address)
        if not isinstance(sink, SqlSink):
            raise ConfigError(f"route {route.name}: its destination is not a SQL queue table")
        topic, group = route.from_.address, route.from_.group
        key = checkpoint_key(group, topic, partition)
        stored = (await sink.load_checkpoint(f"{group}/{topic}/")).get(key)
        sink.fence_checkpoint({key: stored})
        start = max(start, start if stored is None else stored)
        source = PartitionSource(
            kafka,
            topic=topic,
            partition=partition,
            start=start,
            end=end,
            group=group,
            error_queue=route.error_queue_name,
        )
        try:
            return await run_until_exhausted(route, source, sink, fail_after=fail_after)
        except CheckpointConflict:
            raise RangeTakenOver(
                f"{topic}/{partition}: another attempt moved this range (offsets {start} to "
                f"{end - 1}) while this one ran; this attempt rolled back its batch"
            ) from None
    finally:
        await kafka.close()
        await sql.close()


def kafka_task(spec: JobSpec, item: tuple[int, int, int, int]) -> Moved:
    """The Spark task function: `item` is (task index, partition, start offset, end offset)."""
    index, partition, start, end = item
    return run_task(
        spec.fail_after,
        index,
        lambda fail: move_partition(spec, partition, start, end, fail_after=fail),
    )
