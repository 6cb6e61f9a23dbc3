"""The Kafka transport: topics as queues, records as NServiceBus messages (wire-format §9).

Features
    One producer per connection, shared by every sink and by the sources' error-queue copies,
    started on first use (`producer.py`). One consumer per source, in the route's consumer
    group, committing only what its destination made durable (`source.py`, `rebalance.py`);
    bulk jobs read one partition's offset range with `source(..., offsets=...)`
    (`range_source.py`). Records are laid out as `headers.py` says.

Connection
    `bootstrap_servers` (a comma-separated host:port list), `security_protocol` with SASL
    credentials or SSL certificate files (`config.py` checks which go together; `connection.py`
    turns them into aiokafka's arguments).

Options
    `idempotence` (on unless the broker cannot), `compression_type`, `max_batch_size` (a send
    is split into record batches of at most this), `max_request_size` (the largest record a
    sink writes and a consumer fetches), `session_timeout_ms` (how soon a dead bridge's
    partitions move), `request_timeout_ms` (how long any request waits for the broker's answer:
    what bounds a silent network), and the `partitions` and `replication_factor` of topics
    `install` creates.

Addresses
    An address is a topic name, also in NServiceBus headers (`canonical_address` is the
    identity). A source needs a consumer `group`.

Administration
    `install` creates missing topics with `partitions` and `replication_factor` (an existing
    topic is left as it is); when `max_request_size` (or `max_batch_size`) is above the
    broker's default `message.max.bytes`, the topic gets `max.message.bytes` to match, so the
    largest record the sink accepts is one the topic accepts too. With `print_only` it returns
    what it would create, without connecting. `check` lists the cluster's topics (a metadata
    request for named topics would create them on brokers that auto-create) and raises
    `TransportError` naming those missing. `peek` reports the records a topic holds, `depth` =
    sum over partitions of end offset minus beginning offset (retained records, not the lag of
    any group), `oldest_age_seconds` from the timestamp of each partition's first record, and
    `expired = 0` (Kafka does not know).
    `lag` is what a consumer group has yet to read: per partition, the end offset minus where
    the group resumes (the destination's stored position, else the committed offset, else the
    beginning), summed. It reads offsets without joining the group. `partition_offsets` is
    each partition's beginning and end offset, for planning a bulk job.

Limits
    A record is at most `max_request_size` bytes. Order holds per partition: records with the
    same key keep their order.

Errors
    See `errors.py`: an unreachable broker, timeouts, leader and coordinator moves are
    `TransportUnavailable` (retriable); a record refused for good is `MessageRejected`; a
    failed SASL login and a missing ACL are `AccessRefused`; other refusals are
    `TransportError`.

What is lossy
    Kafka destinations are at-least-once (a retried send may duplicate a record unless
    `idempotence` is on); the record key is derived from the headers and not read back; a
    tombstone reads as an empty body (`headers.py`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, overload

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code

from bridge.errors import ConfigError, TransportError
from bridge.nservicebus.deadletter import DEFAULT_ERROR_QUEUE
from bridge.protocols import Checkpoint, CheckpointStore, QueueStats
from bridge.transports.kafka.config import KafkaConnection
from bridge.transports.kafka.connection import client_kwargs, consumer_kwargs
from bridge.transports.kafka.errors import translate, translated
from bridge.transports.kafka.headers import DEFAULT_KEY
from bridge.transports.kafka.producer import SharedProducer
from bridge.transports.kafka.range_source import KafkaRangeSource
from bridge.transports.kafka.sink import KafkaSink
from bridge.transports.kafka.source import KafkaSource, checkpoint_key

__all__ = ["KafkaRangeSource", "KafkaSink", "KafkaSource", "Transport"]


#: Kafka's default `message.max.bytes` (1 MiB plus the legacy log overhead): the largest
#: record batch a topic without its own `max.message.bytes` accepts.
BROKER_MESSAGE_MAX_BYTES = 1_048_588

#: How long `peek` waits for the first record of each partition.
_PEEK_FETCH_SECONDS = 5.0


class Transport:
    def __init__(self, name: str, config: KafkaConnection) -> None:
        self.name = name
        self.config = config
        #: The connection's one producer (started on first use by a sink or an error copy).
        self.producer = SharedProducer(name, config)
        self._sources: set[KafkaSource | KafkaRangeSource] = set()

    @overload
    def source(
        self,
        address: str,
        *,
        group: str | None = None,
        error_queue: str | None = None,
        checkpoint_store: CheckpointStore | None = None,
        offsets: None = None,
    ) -> KafkaSource: ...

    @overload
    def source(
        self,
        address: str,
        *,
        group: str | None = None,
        error_queue: str | None = None,
        checkpoint_store: CheckpointStore | None = None,
        offsets: tuple[int, int, int],
    ) -> KafkaRangeSource: ...

    def source(
        self,
        address: str,
        *,
        group: str | None = None,
        error_queue: str | None = None,
        checkpoint_store: CheckpointStore | None = None,
        offsets: tuple[int, int, int] | None = None,
    ) -> KafkaSource | KafkaRangeSource:
        """A source in consumer `group`; with `offsets=(partition, start, end)`, one that reads
        only that partition's offsets start..end-1, outside the group (`range_source.py`)."""
        if group is None:
            raise ConfigError(
                f"kafka connection {self.name!r}: reading topic {address!r} needs a consumer "
                "`group`"
            )
        source: KafkaSource | KafkaRangeSource
        if offsets is not None:
            if checkpoint_store is not None:
                raise ConfigError(
                    f"kafka connection {self.name!r}: a range of topic {address!r} starts where "
                    "`offsets` says; it takes no checkpoint store"
                )
            partition, start, end = offsets
            source = KafkaRangeSource(
                topic=address,
                partition=partition,
                start=start,
                end=end,
                group=group,
                consumer_kwargs=consumer_kwargs(self.config, None),
                producer=self.producer,
                error_queue=error_queue or DEFAULT_ERROR_QUEUE,
                max_request_size=self.config.max_request_size,
            )
        else:
            source = KafkaSource(
                topic=address,
                group=group,
                consumer_kwargs=consumer_kwargs(self.config, group),
                producer=self.producer,
                error_queue=error_queue or DEFAULT_ERROR_QUEUE,
                max_request_size=self.config.max_request_size,
                checkpoint_store=checkpoint_store,
            )
        self._sources.add(source)
        return source

    def sink(self, address: str, *, key: str | None = None) -> KafkaSink:
        return KafkaSink(address, key or DEFAULT_KEY, self.producer, self.config.max_request_size)

    async def install(self, addresses: Sequence[str], *, print_only: bool = False) -> list[str]:
        wanted = list(dict.fromkeys(addresses))
        shape = f"partitions={self.config.partitions} replication={self.config.replication_factor}"
        settings = self.topic_configs()
        shape += "".join(f" {name}={value}" for name, value in settings.items())
        if print_only:
            return [f"create topic {topic} {shape}" for topic in wanted]
        topics = [
            NewTopic(
                topic,
                self.config.partitions,
                self.config.replication_factor,
                topic_configs=settings,
            )
            for topic in wanted
        ]
        done: list[str] = []
        async with self._admin("create topics") as admin:
            with translated(f"connection {self.name!r}: create topics"):
                response = await admin.create_topics(topics)
        for topic, code, *message in response.topic_errors:
            error = for_code(code)
            if error is TopicAlreadyExistsError:
                done.append(f"topic {topic} exists")
            elif code != 0:
                detail = message[0] if message and message[0] else error.__name__
                raise translate(error(detail), f"connection {self.name!r}: create topic {topic!r}")
            else:
                done.append(f"created topic {topic} {shape}")
        return done

    def topic_configs(self) -> dict[str, str]:
        """The settings `install` gives a new topic: `max.message.bytes` when a record batch
        may be larger than a stock broker takes."""
        largest = max(self.config.max_request_size, self.config.max_batch_size)
        if largest <= BROKER_MESSAGE_MAX_BYTES:
            return {}
        return {"max.message.bytes": str(largest)}

    async def check(self, addresses: Sequence[str]) -> list[str]:
        existing = await self._topics()
        missing = [a for a in dict.fromkeys(addresses) if a not in existing]
        if missing:
            raise TransportError(
                f"kafka connection {self.name!r}: missing topics: {', '.join(missing)} "
                "(run `bridge install`)"
            )
        return []

    async def peek(self, address: str) -> QueueStats:
        if address not in await self._topics():
            raise TransportError(f"kafka connection {self.name!r}: no topic {address!r}")
        consumer = AIOKafkaConsumer(**consumer_kwargs(self.config, None))
        with translated(f"connection {self.name!r}: peek at topic {address!r}"):
            await consumer.start()
            try:
                return await _topic_stats(consumer, address)
            finally:
                await consumer.stop()

    async def lag(self, address: str, group: str, stored: Checkpoint | None = None) -> int:
        """Records `group` has yet to read from topic `address`; see the module docstring."""
        consumer = AIOKafkaConsumer(**consumer_kwargs(self.config, group))
        with translated(f"connection {self.name!r}: lag of group {group!r} on {address!r}"):
            await consumer.start()
            try:
                partitions = consumer.partitions_for_topic(address)
                if partitions is None:
                    raise TransportError(f"kafka connection {self.name!r}: no topic {address!r}")
                tps = [TopicPartition(address, p) for p in sorted(partitions)]
                begin = await consumer.beginning_offsets(tps)
                end = await consumer.end_offsets(tps)
                lag = 0
                for tp in tps:
                    position = (stored or {}).get(checkpoint_key(group, address, tp.partition))
                    if position is None:
                        position = await consumer.committed(tp)
                    # an offset below the beginning resumes there (auto_offset_reset)
                    lag += max(0, end[tp] - max(position or 0, begin[tp]))
                return lag
            finally:
                await consumer.stop()

    async def partition_offsets(self, address: str) -> dict[int, tuple[int, int]]:
        """{partition: (beginning offset, end offset)} of topic `address`; TransportError when
        the topic is missing."""
        consumer = AIOKafkaConsumer(**consumer_kwargs(self.config, None))
        with translated(f"connection {self.name!r}: read the offsets of topic {address!r}"):
            await consumer.start()
            try:
                if address not in await consumer.topics():
                    raise TransportError(f"kafka: no topic {address!r} (run `bridge install`)")
                partitions = sorted(consumer.partitions_for_topic(address))
                tps = [TopicPartition(address, p) for p in partitions]
                begin = await consumer.beginning_offsets(tps)
                end = await consumer.end_offsets(tps)
            finally:
                await consumer.stop()
        return {tp.partition: (int(begin[tp]), int(end[tp])) for tp in tps}

    def canonical_address(self, address: str) -> str:
        return address

    async def close(self) -> None:
        sources, self._sources = self._sources, set()
        for source in sources:
            await source.close()
        await self.producer.close()

    async def _topics(self) -> set[str]:
        async with self._admin("list topics") as admin:
            with translated(f"connection {self.name!r}: list topics"):
                return set(await admin.list_topics())

    @asynccontextmanager
    async def _admin(self, what: str) -> AsyncIterator[Any]:
        admin = AIOKafkaAdminClient(**client_kwargs(self.config))
        try:
            with translated(f"connection {self.name!r}: {what}"):
                await admin.start()
            yield admin
        finally:
            await admin.close()


async def _topic_stats(consumer: Any, topic: str) -> QueueStats:
    partitions = consumer.partitions_for_topic(topic) or set()
    tps = [TopicPartition(topic, p) for p in sorted(partitions)]
    consumer.assign(tps)
    begin = await consumer.beginning_offsets(tps)
    end = await consumer.end_offsets(tps)
    depth = sum(max(0, end[tp] - begin[tp]) for tp in tps)
    waiting = {tp for tp in tps if end[tp] > begin[tp]}
    for tp in tps:
        consumer.seek(tp, begin[tp])
    oldest: int | None = None
    deadline = time.monotonic() + _PEEK_FETCH_SECONDS
    while waiting and time.monotonic() < deadline:
        fetched = await consumer.getmany(*waiting, timeout_ms=200, max_records=len(waiting))
        for tp, records in fetched.items():
            if records and tp in waiting:
                waiting.discard(tp)
                stamp = records[0].timestamp
                oldest = stamp if oldest is None else min(oldest, stamp)
    age = None if oldest is None else max(0.0, time.time() - oldest / 1000)
    return QueueStats(depth=depth, oldest_age_seconds=age, expired=0)
