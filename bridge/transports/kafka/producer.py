"""The connection's one producer and the write path every record takes through it.

Guarantees
    `produce` returns only when every record of the call is acknowledged with `acks=all`. The
    records of a call are handed to the producer together, so they go out at once (a call is a
    complete batch: lingering for more would only add latency), then awaited together. Records
    with the same key go to the same partition (the Kafka producers' default partitioner) in
    the order given (the producer keeps one request in flight per broker). A failure is never
    swallowed: when several records fail, the one with the lowest index decides what is raised.

Errors
    `MessageRejected(index)` when a record can never be written: larger than `max_request_size`
    (checked before anything of the call is written), refused by the broker as too large or with
    an invalid timestamp, or sent to a topic that the cluster does not have (aiokafka waits
    `request_timeout_ms` for it first). The broker refuses a whole record batch: when that batch
    held more than one record, the index is None (which record is at fault is unknown;
    `refused_batch`). `TransportUnavailable` for what may go away (connection, timeouts, leader
    changes); `TransportError` for the rest (see `errors.py`).

Speed-up seam `kafka_record_batches`
    `send_records` is `send_in_batches`, which lays a call's records into closed record batches
    itself (partitions from `partitioner.py`) and hands each to `send_batch`, because aiokafka's
    `send` costs a metadata wait, a partitioner call and an accumulator append per record; it
    reads the cluster's available partitions and closes the builders through aiokafka
    internals. `send_each` is the plain one: aiokafka's public `send` per record. Measured by
    `bench/speedups.py kafka_record_batches`; `tests/integration/test_kafka_record_batches.py`
    checks that both put the same records on the same partitions in the same order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import UnknownTopicOrPartitionError
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from bridge.errors import BridgeError, MessageRejected, TransportUnavailable
from bridge.speedups import enabled
from bridge.transports.kafka.config import KafkaConnection
from bridge.transports.kafka.connection import producer_kwargs
from bridge.transports.kafka.errors import DRIVER_ERRORS, translate, translated
from bridge.transports.kafka.headers import Record
from bridge.transports.kafka.partitioner import partitions_for

__all__ = [
    "ProducerFactory",
    "SharedProducer",
    "produce",
    "refused_batch",
    "send_each",
    "send_in_batches",
    "send_records",
]

#: Returns the transport's started producer (an `aiokafka.AIOKafkaProducer`).
ProducerFactory = Callable[[], Awaitable[Any]]

#: (index of the first record of what failed, how many records it held, the cause)
Failure = tuple[int, int, BaseException]

#: Sends a call's records through a started producer; the first failure, if any.
SendRecords = Callable[[Any, str, Sequence[Record]], Awaitable[Failure | None]]


class SharedProducer:
    """A connection's one producer (a `ProducerFactory`): started by the first call, shared by
    every sink and by the sources' error-topic copies."""

    def __init__(self, name: str, config: KafkaConnection) -> None:
        self._name = name
        self._config = config
        self._producer: Any = None
        self._lock = asyncio.Lock()

    async def __call__(self) -> Any:
        async with self._lock:
            if self._producer is None:
                producer = AIOKafkaProducer(**producer_kwargs(self._config))
                try:
                    with translated(f"connection {self._name!r}: start the producer"):
                        await producer.start()
                except BaseException:
                    await producer.stop()
                    raise
                self._producer = producer
            return self._producer

    async def close(self) -> None:
        async with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            with translated(f"connection {self._name!r}: stop the producer"):
                await producer.stop()


async def produce(
    producer_factory: ProducerFactory,
    topic: str,
    records: Sequence[Record],
    max_request_size: int,
) -> None:
    """Write `records` to `topic` and wait until all are acknowledged (see the module doc)."""
    for index, record in enumerate(records):
        size = DefaultRecordBatchBuilder.estimate_size_in_bytes(
            record.key, record.value, record.headers
        )
        if size > max_request_size:
            raise MessageRejected(
                f"kafka: record for topic {topic!r} is {size} bytes, more than "
                f"max_request_size ({max_request_size})",
                index=index,
            )
    what = f"send to topic {topic!r}"
    try:
        producer = await producer_factory()
    except DRIVER_ERRORS as exc:
        raise translate(exc, "start the producer") from exc
    failure = await send_records(producer, topic, records)
    if failure is not None:
        index, count, cause = failure
        raise refused_batch(await _explain(producer, topic, what, index, cause), count) from cause


def refused_batch(error: BridgeError, records: int) -> BridgeError:
    """`error` for a record batch of `records` records that the broker refused as a whole.

    The broker answers for the batch: when it held more than one record, which of them is too
    large (or otherwise refused) is unknown, so the rejection names none and the runner sends
    each message alone to find it, instead of blaming the batch's first, maybe innocent, one.
    """
    if isinstance(error, MessageRejected) and error.index is not None and records > 1:
        return MessageRejected(str(error), index=None)
    return error


async def send_in_batches(producer: Any, topic: str, records: Sequence[Record]) -> Failure | None:
    """Send `records` as closed record batches, one per partition (more past `max_batch_size`),
    and wait for every acknowledgement; the first failure by record index, if any."""
    try:
        batches = await _record_batches(producer, topic, records)
    except DRIVER_ERRORS as exc:
        return (0, 1, exc)
    pending: list[tuple[int, int, asyncio.Future[Any]]] = []
    failure: Failure | None = None
    for first, partition, builder in batches:
        try:
            sent = await producer.send_batch(builder, topic, partition=partition)
        except DRIVER_ERRORS as exc:
            failure = (first, builder.record_count(), exc)
            break
        pending.append((first, builder.record_count(), sent))
    # Wait for what was handed over even after a failure, so nothing is left in flight unseen.
    results = await asyncio.gather(*(future for _, _, future in pending), return_exceptions=True)
    for (first, count, _), result in zip(pending, results, strict=True):
        if isinstance(result, BaseException) and (failure is None or first < failure[0]):
            failure = (first, count, result)
    return failure


async def _record_batches(
    producer: Any, topic: str, records: Sequence[Record]
) -> list[tuple[int, int, Any]]:
    """(index of its first record, partition, closed BatchBuilder), in the order to send them.

    Partitions are chosen as the producer's own `send` would (`partitioner.py`), so keys keep
    their partition.
    """
    every = sorted(await producer.partitions_for(topic))
    available = sorted(producer.client.cluster.available_partitions_for_topic(topic)) or every
    batches: list[tuple[int, int, Any]] = []
    open_builders: dict[int, Any] = {}
    chosen = partitions_for([record.key for record in records], every, available)
    for index, ((key, value, headers, timestamp_ms), partition) in enumerate(
        zip(records, chosen, strict=True)
    ):
        builder = open_builders.get(partition)
        if builder is None or (
            builder.append(timestamp=timestamp_ms, key=key, value=value, headers=headers) is None
        ):
            builder = open_builders[partition] = producer.create_batch()
            builder.append(timestamp=timestamp_ms, key=key, value=value, headers=headers)
            batches.append((index, partition, builder))
    for _, _, builder in batches:
        builder.close()  # a closed batch is sent now; an open one would linger for more
    return batches


async def send_each(producer: Any, topic: str, records: Sequence[Record]) -> Failure | None:
    """Send `records` one `send` each (aiokafka partitions and batches them) and wait for every
    acknowledgement; the first failure by record index, if any.

    Which records shared a refused batch is not visible here: the count is the records that
    failed with the same error, so more than one means "unknown which" (`refused_batch`).
    """
    pending: list[asyncio.Future[Any]] = []
    failure: Failure | None = None
    for index, record in enumerate(records):
        try:
            pending.append(
                await producer.send(
                    topic,
                    record.value,
                    key=record.key,
                    headers=record.headers,
                    timestamp_ms=record.timestamp_ms,
                )
            )
        except DRIVER_ERRORS as exc:
            failure = (index, 1, exc)
            break
    results = await asyncio.gather(*pending, return_exceptions=True)
    failed = [(i, r) for i, r in enumerate(results) if isinstance(r, BaseException)]
    if failed and (failure is None or failed[0][0] < failure[0]):
        index, cause = failed[0]
        failure = (index, sum(type(r) is type(cause) for _, r in failed), cause)
    return failure


#: How a call's records go to the producer: the `kafka_record_batches` seam.
send_records: SendRecords = send_in_batches if enabled("kafka_record_batches") else send_each


async def _explain(
    producer: Any, topic: str, what: str, index: int, exc: BaseException
) -> BridgeError:
    if isinstance(exc, asyncio.CancelledError):  # the producer was stopped under the send
        return TransportUnavailable(f"kafka: {what}: the producer was closed")
    if isinstance(exc, UnknownTopicOrPartitionError):
        try:
            cluster = await producer.client.fetch_all_metadata()
        except DRIVER_ERRORS:
            return translate(exc, what, index=index)
        if topic not in cluster.topics():
            return MessageRejected(f"kafka: {what}: the topic does not exist", index=index)
    return translate(exc, what, index=index)
