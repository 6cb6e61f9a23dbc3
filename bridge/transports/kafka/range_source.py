"""A Kafka source over one partition's offset range [start, end), for bulk jobs.

The consumer is assigned the partition by hand: no group membership, no Kafka commits. Batches
are what a group source hands out: envelopes decoded by the same codec, `batch.checkpoint` the
partition's next offset under the group's name for it (`checkpoint_key`), poison records copied
to the error topic before their batch is handed out and messages the destination refused for
good copied there at commit (`deadletter.py`). A destination that stores the checkpoint with its
rows makes a retried range resume from there (the caller passes that position as `start`).
`abort()` seeks back to the batch's first record. Records at or past `end` are left alone; once
the consumer's position reaches `end` the source returns empty batches.

Errors
    As the group source; also `TransportUnavailable` when the end offset promises records that
    do not arrive for `STALL_SECONDS`.
"""

from __future__ import annotations

import time
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from bridge.batch import Batch, Rejected
from bridge.errors import TransportUnavailable
from bridge.transports.kafka.deadletter import ErrorQueue
from bridge.transports.kafka.errors import translated
from bridge.transports.kafka.headers import read_records
from bridge.transports.kafka.producer import ProducerFactory
from bridge.transports.kafka.source import checkpoint_key

__all__ = ["STALL_SECONDS", "KafkaRangeSource"]

#: Longest wait for a record the end offset says is there before the source gives up.
STALL_SECONDS = 60.0


class KafkaRangeSource:
    """A `Source` over offsets start..end-1 of one partition (see the module docstring)."""

    def __init__(
        self,
        *,
        topic: str,
        partition: int,
        start: int,
        end: int,
        group: str,
        consumer_kwargs: dict[str, Any],
        producer: ProducerFactory,
        error_queue: str,
        max_request_size: int,
    ) -> None:
        self._tp = TopicPartition(topic, partition)
        self._next = start
        self._end = end
        self._key = checkpoint_key(group, topic, partition)
        self._consumer_kwargs = consumer_kwargs
        self._consumer: Any = None
        self._errors = ErrorQueue(producer, error_queue, topic, max_request_size)

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
            consumer = AIOKafkaConsumer(**self._consumer_kwargs)
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
