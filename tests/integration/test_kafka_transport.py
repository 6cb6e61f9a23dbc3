"""The Kafka transport against the real local broker (tansu): sink, source, install, peek.

tansu holds a JoinGroup for about half the session timeout, so most tests use a source whose
consumer has a short session (`fast_source`); everything else is the production code path.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from bridge.config.models import KafkaConnection
from bridge.envelope import MESSAGE_ID, TIME_TO_BE_RECEIVED, Envelope, Headers
from bridge.errors import ConfigError, MessageRejected, TransportError, TransportUnavailable
from bridge.transports.kafka import KafkaSource, Transport
from bridge.transports.kafka.connection import consumer_kwargs
from bridge.transports.kafka.headers import record_message_id
from tests.conftest import unique

pytestmark = pytest.mark.integration

MIB = 1024 * 1024


@asynccontextmanager
async def kafka(bootstrap: str, **settings: Any) -> AsyncIterator[Transport]:
    config = KafkaConnection.model_validate(
        {"type": "kafka", "bootstrap_servers": bootstrap, "idempotence": False, **settings}
    )
    transport = Transport("kafka", config)
    _sources[transport] = []
    try:
        yield transport
    finally:
        for source in _sources.pop(transport):
            await source.close()
        await transport.close()


_sources: dict[Transport, list[KafkaSource]] = {}


def fast_source(
    transport: Transport,
    topic: str,
    group: str,
    *,
    store: Any = None,
    error_queue: str = "bridge.error",
) -> KafkaSource:
    kwargs = {
        **consumer_kwargs(transport.config, group),
        "session_timeout_ms": 2000,
        "heartbeat_interval_ms": 300,
    }
    source = KafkaSource(
        topic=topic,
        group=group,
        consumer_kwargs=kwargs,
        producer=transport.producer,
        error_queue=error_queue,
        max_request_size=transport.config.max_request_size,
        checkpoint_store=store,
    )
    source.revoke_grace = 0.5
    _sources[transport].append(source)
    return source


def message(i: int, body: bytes | None = None, *extra: tuple[str, str | None]) -> Envelope:
    headers = Headers([(MESSAGE_ID, f"id-{i}"), *extra])
    return Envelope(headers, f"body-{i}".encode() if body is None else body)


async def drain(
    source: KafkaSource, expected: int, *, batch_size: int = 500, timeout: float = 30
) -> list[Envelope]:
    """Receive and commit until `expected` messages arrived."""
    got: list[Envelope] = []
    deadline = time.monotonic() + timeout
    while len(got) < expected:
        assert time.monotonic() < deadline, f"received {len(got)} of {expected}"
        batch = await source.receive_batch(batch_size, 1.0)
        async with batch:
            got.extend(batch.messages)
            await batch.commit()
    return got


async def nothing_more(source: KafkaSource) -> bool:
    batch = await source.receive_batch(100, 0.5)
    await batch.abort()
    return not batch.messages and not batch.poison


async def first_batch(source: KafkaSource, max_messages: int) -> Any:
    """The first non-empty batch (the first receives may only join the group)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        batch = await source.receive_batch(max_messages, 1.0)
        if batch.messages or batch.poison:
            return batch
        await batch.abort()
    raise AssertionError("no batch arrived")


async def take(source: KafkaSource, into: list[Envelope]) -> int:
    """Receive one batch into `into` and commit it; how many messages it held."""
    batch = await source.receive_batch(100, 0.5)
    into.extend(batch.messages)
    await batch.commit()
    return len(batch.messages)


async def join(source: KafkaSource, into: list[Envelope]) -> None:
    """Receive (and commit) until the group gave `source` partitions."""
    deadline = time.monotonic() + 30
    while not source.partitions:
        assert time.monotonic() < deadline, "the consumer never got partitions"
        await take(source, into)


def offset(envelope: Envelope) -> int:
    return int((envelope.native_id or "").rsplit("/", 1)[1])


async def test_install_lets_topics_take_records_as_large_as_the_sink_sends(
    kafka_bootstrap: str,
) -> None:
    """Above a stock broker's `message.max.bytes`, a created topic gets `max.message.bytes`."""
    large, small = unique("large"), unique("small")
    async with kafka(kafka_bootstrap, partitions=1, max_request_size=2 * MIB) as transport:
        shape = f"partitions=1 replication=1 max.message.bytes={2 * MIB}"
        assert await transport.install([large], print_only=True) == [
            f"create topic {large} {shape}"
        ]
        assert await transport.install([large]) == [f"created topic {large} {shape}"]
    async with kafka(kafka_bootstrap, partitions=1) as transport:
        assert await transport.install([small]) == [
            f"created topic {small} partitions=1 replication=1"
        ]
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        described = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic) for topic in (large, small)]
        )
    finally:
        await admin.close()
    settings = {
        resource[3]: {entry[0]: entry[1] for entry in resource[4]}
        for response in described
        for resource in response.resources
    }
    assert settings[large]["max.message.bytes"] == str(2 * MIB)
    assert settings[small].get("max.message.bytes") != str(2 * MIB)


async def test_a_source_needs_a_group(kafka_bootstrap: str) -> None:
    async with kafka(kafka_bootstrap) as transport:
        with pytest.raises(ConfigError, match="needs a consumer `group`"):
            transport.source("sales")


async def test_round_trip_of_1000_messages_keeps_every_header_and_byte(
    kafka_bootstrap: str,
) -> None:
    topic, group = unique("round"), unique("g")
    rng = random.Random(1000)
    now = time.time()
    sent: list[Envelope] = []
    for i in range(1000):
        headers = Headers(
            [
                (MESSAGE_ID, f"id-{i}"),
                ("NServiceBus.ReplyToAddress", "Sales@[dbo]@[nservicebus]"),
                ("dup", "first"),
                ("null", None),
                ("empty", ""),
                ("dup", "second"),
                ("unicode", f"café / 東京 / \u2028 \U0001f600 {i}"),
                (TIME_TO_BE_RECEIVED, "01:00:00"),  # read by nothing: carried as it is
            ]
        )
        body = rng.randbytes(rng.randrange(0, 2048))
        expires_at = now + 3600 if i % 10 == 0 else None
        sent.append(Envelope(headers, body, expires_at=expires_at))
    sent[500].body = rng.randbytes(MIB)
    async with kafka(kafka_bootstrap, partitions=3, max_request_size=2 * MIB) as transport:
        await transport.install([topic])
        sink = transport.sink(topic)
        for start in range(0, 1000, 250):
            await sink.send(sent[start : start + 250])
        source = fast_source(transport, topic, group)
        got = await drain(source, 1000)
        assert await nothing_more(source)
    assert Counter(e.message_id for e in got) == Counter(e.message_id for e in sent)
    by_id = {e.message_id: e for e in got}
    for original in sent:
        copy = by_id[original.message_id]
        assert copy.body == original.body
        assert copy.headers == original.headers
        if original.expires_at is None:
            assert copy.expires_at is None
        else:  # the deadline header, microseconds
            assert copy.expires_at == pytest.approx(original.expires_at, abs=1e-5)
        assert (copy.native_id or "").startswith(f"{topic}/")


async def test_order_is_kept_within_a_key(kafka_bootstrap: str) -> None:
    topic, group = unique("order"), unique("g")
    sent = [message(i, None, ("Conv", f"c-{i % 7}"), ("seq", str(i))) for i in range(700)]
    async with kafka(kafka_bootstrap, partitions=3) as transport:
        await transport.install([topic])
        await transport.sink(topic, key="header:Conv").send(sent)
        got = await drain(fast_source(transport, topic, group), 700, batch_size=64)
    by_conv: dict[str, list[Envelope]] = {}
    for envelope in got:
        by_conv.setdefault(envelope.headers.get("Conv") or "", []).append(envelope)
    assert len(by_conv) == 7
    for conv, envelopes in by_conv.items():
        seqs = [int(e.headers.get("seq") or -1) for e in envelopes]
        assert seqs == sorted(seqs) and len(seqs) == 100, conv
        partitions = {(e.native_id or "").split("/")[1] for e in envelopes}
        assert len(partitions) == 1, conv


async def test_a_key_lands_where_a_plain_producer_puts_it(kafka_bootstrap: str) -> None:
    """The sink builds its record batches itself; keys must still keep the partition the
    producer's default partitioner (and so every other Kafka client) gives them."""
    topic, group = unique("keys"), unique("g")
    keys = [f"c-{i}" for i in range(40)]
    async with kafka(kafka_bootstrap, partitions=5) as transport:
        await transport.install([topic])
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False)
        await producer.start()
        try:
            plain = {
                k: (await producer.send_and_wait(topic, b"x", key=k.encode())).partition
                for k in keys
            }
        finally:
            await producer.stop()
        await transport.sink(topic, key="header:Conv").send(
            [message(i, None, ("Conv", k)) for i, k in enumerate(keys)]
        )
        got = await drain(fast_source(transport, topic, group), 2 * len(keys), batch_size=64)
    bridged = {
        e.headers.get("Conv"): int((e.native_id or "").split("/")[1])
        for e in got
        if e.headers.get("Conv")
    }
    assert bridged == plain
    assert len(set(plain.values())) > 1


async def test_commit_then_a_new_consumer_resumes_after_it(kafka_bootstrap: str) -> None:
    topic, group = unique("resume"), unique("g")
    async with kafka(kafka_bootstrap, partitions=3) as transport:
        await transport.install([topic])
        await transport.sink(topic).send([message(i) for i in range(60)])
        first = fast_source(transport, topic, group)
        batch = await first_batch(first, 25)
        taken = {e.message_id for e in batch.messages}
        expected: dict[str, int] = {}
        for e in batch.messages:
            _, partition, position = (e.native_id or "").split("/")
            key = f"{group}/{topic}/{partition}"
            expected[key] = max(expected.get(key, 0), int(position) + 1)
        assert batch.checkpoint == expected
        await batch.commit()
        await first.close()
        second = fast_source(transport, topic, group)
        rest = await drain(second, 60 - len(taken))
        assert await nothing_more(second)
    assert taken.isdisjoint(e.message_id for e in rest)
    assert taken | {e.message_id for e in rest} == {f"id-{i}" for i in range(60)}


class Store:
    """What a SQL sink keeps next to its rows: source positions by checkpoint key."""

    def __init__(self, positions: dict[str, int]) -> None:
        self.positions = positions
        self.prefixes: list[str] = []

    async def load_checkpoint(self, prefix: str) -> dict[str, int]:
        self.prefixes.append(prefix)
        return {k: v for k, v in self.positions.items() if k.startswith(prefix)}


async def test_stored_positions_win_over_kafka_commits(kafka_bootstrap: str) -> None:
    topic, group = unique("stored"), unique("g")
    async with kafka(kafka_bootstrap, partitions=2) as transport:
        await transport.install([topic])
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False)
        await producer.start()
        try:
            for partition in (0, 1):
                for i in range(10):
                    await producer.send(topic, f"{partition}-{i}".encode(), partition=partition)
            await producer.flush()
        finally:
            await producer.stop()
        lagging = fast_source(transport, topic, group)
        committed = await first_batch(lagging, 2)  # Kafka's committed offsets stay behind
        await committed.commit()
        await lagging.close()
        store = Store({f"{group}/{topic}/0": 6, f"{group}/{topic}/1": 9, f"other/{topic}/0": 1})
        source = fast_source(transport, topic, group, store=store)
        got = await drain(source, 5)
        assert await nothing_more(source)
    assert set(store.prefixes) == {f"{group}/{topic}/"}
    assert sorted(e.body for e in got) == [b"0-6", b"0-7", b"0-8", b"0-9", b"1-9"]


async def test_a_partition_without_stored_position_starts_at_its_commit(
    kafka_bootstrap: str,
) -> None:
    topic, group = unique("nostore"), unique("g")
    async with kafka(kafka_bootstrap, partitions=1) as transport:
        await transport.install([topic])
        await transport.sink(topic).send([message(i) for i in range(6)])
        lagging = fast_source(transport, topic, group)
        batch = await first_batch(lagging, 2)
        await batch.commit()
        await lagging.close()
        source = fast_source(transport, topic, group, store=Store({}))
        got = await drain(source, 4)
    assert [offset(e) for e in got] == [2, 3, 4, 5]


class FlakyStore(Store):
    """Fails its first load, as a destination database that is briefly away would."""

    async def load_checkpoint(self, prefix: str) -> dict[str, int]:
        if not self.prefixes:
            self.prefixes.append(prefix)
            raise TransportUnavailable("database away")
        return await super().load_checkpoint(prefix)


async def test_partitions_wait_for_their_stored_position_when_loading_it_fails(
    kafka_bootstrap: str,
) -> None:
    topic, group = unique("flaky"), unique("g")
    async with kafka(kafka_bootstrap, partitions=1) as transport:
        await transport.install([topic])
        await transport.sink(topic).send([message(i) for i in range(8)])
        store = FlakyStore({f"{group}/{topic}/0": 5})
        source = fast_source(transport, topic, group, store=store)
        got = await drain(source, 3)
        assert await nothing_more(source)
    assert len(store.prefixes) >= 2
    assert [offset(e) for e in got] == [5, 6, 7]


async def test_too_large_record_is_rejected_with_its_index_before_anything_is_written(
    kafka_bootstrap: str,
) -> None:
    topic, group = unique("large"), unique("g")
    async with kafka(kafka_bootstrap, partitions=1) as transport:
        await transport.install([topic])
        sink = transport.sink(topic)
        batch = [message(0), message(1), message(2, b"x" * (MIB + 1)), message(3)]
        with pytest.raises(MessageRejected) as caught:
            await sink.send(batch)
        assert caught.value.index == 2
        assert not caught.value.retriable
        await sink.send([message(0), message(1), message(3)])
        source = fast_source(transport, topic, group)
        got = await drain(source, 3)
        assert await nothing_more(source)
    assert [e.message_id for e in got] == ["id-0", "id-1", "id-3"]


async def test_header_not_utf8_is_poison_copied_once_to_the_error_queue(
    kafka_bootstrap: str,
) -> None:
    topic, errors, group = unique("poison"), unique("errors"), unique("g")
    bad_headers = [("ok", b"fine"), ("bad", b"\xff\xfe"), ("null", None)]
    async with kafka(kafka_bootstrap, partitions=1) as transport:
        await transport.install([topic, errors])
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"before", headers=[(MESSAGE_ID, b"m-0")])
            await producer.send_and_wait(topic, b"poison", key=b"k", headers=bad_headers)
            await producer.send_and_wait(topic, b"after")
        finally:
            await producer.stop()
        source = fast_source(transport, topic, group, error_queue=errors)
        batch = await first_batch(source, 10)
        assert [e.body for e in batch.messages] == [b"before", b"after"]
        assert batch.messages[1].message_id == record_message_id(topic, 0, 2)
        (poison,) = batch.poison
        assert poison.native_id == f"{topic}/0/1"
        assert poison.body == b"poison"
        await batch.abort()
        again = await source.receive_batch(10, 5.0)
        assert len(again.poison) == 1
        await again.commit()
        reader = AIOKafkaConsumer(
            errors, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest"
        )
        await reader.start()
        try:
            fetched = await reader.getmany(timeout_ms=5000)
            copies = [r for records in fetched.values() for r in records]
            assert not await reader.getmany(timeout_ms=300)  # copied once despite the abort
        finally:
            await reader.stop()
    (copy,) = copies
    assert copy.value == b"poison" and copy.key == b"k"
    assert list(copy.headers[:3]) == bad_headers
    added = dict(copy.headers[3:])
    assert added[MESSAGE_ID] == record_message_id(topic, 0, 1).encode()
    assert added["NServiceBus.FailedQ"] == topic.encode()
    assert added["NServiceBus.ExceptionInfo.ExceptionType"] == b"HeadersFormatError"
    assert b"not UTF-8" in (added["NServiceBus.ExceptionInfo.Message"] or b"")
    assert (added["NServiceBus.TimeOfFailure"] or b"").endswith(b" Z")


async def test_peek_counts_retained_records_and_oldest_age(kafka_bootstrap: str) -> None:
    topic = unique("peek")
    async with kafka(kafka_bootstrap, partitions=2) as transport:
        await transport.install([topic])
        empty = await transport.peek(topic)
        assert (empty.depth, empty.oldest_age_seconds, empty.expired) == (0, None, 0)
        sink = transport.sink(topic)
        for i in range(5):  # one record per produce request (tansu's end offset is per batch)
            await sink.send([message(i)])
        stats = await transport.peek(topic)
        assert stats.depth == 5
        assert stats.oldest_age_seconds is not None and 0 <= stats.oldest_age_seconds < 60
        assert stats.expired == 0
        with pytest.raises(TransportError, match="no topic"):
            await transport.peek(unique("absent"))


async def test_commit_after_the_partitions_moved_on_does_not_fail_the_route(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic, group = unique("rebalance"), unique("g")
    total = 40
    async with kafka(kafka_bootstrap, partitions=2) as transport:
        await transport.install([topic])
        # no key: each record goes to a random partition, so both partitions get records
        await transport.sink(topic, key="none").send([message(i) for i in range(total)])
        first = fast_source(transport, topic, group)
        batch = await first_batch(first, total)
        held = list(batch.messages)
        assert len(batch.checkpoint or {}) == 2  # one of the two partitions will move away
        second = fast_source(transport, topic, group)
        # The second member's first receives join the group; the first member's partitions are
        # revoked meanwhile (its revoke grace runs out while the batch is held).
        seen: list[Envelope] = []
        await join(second, seen)
        with caplog.at_level(logging.WARNING, logger="bridge.kafka"):
            await batch.commit()  # logged, not raised
        assert "not committed (no longer assigned)" in caplog.text
        deadline = time.monotonic() + 30
        while len({e.message_id for e in [*held, *seen]}) < total:
            assert time.monotonic() < deadline
            for source in (first, second):
                await take(source, seen)
    delivered = Counter(e.message_id for e in [*held, *seen])
    assert set(delivered) == {f"id-{i}" for i in range(total)}
    assert sum(delivered.values()) - total <= len(held)  # duplicates only of what was in flight


async def test_a_batch_settled_during_the_revoke_grace_hands_over_cleanly(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic, group = unique("handover"), unique("g")
    total = 40
    async with kafka(kafka_bootstrap, partitions=2) as transport:
        await transport.install([topic])
        await transport.sink(topic, key="none").send([message(i) for i in range(total)])
        first = fast_source(transport, topic, group)
        first.revoke_grace = 10  # ends as soon as the batch settles
        batch = await first_batch(first, total)
        held = list(batch.messages)
        revoking = asyncio.Event()
        on_revoked = first._on_revoked

        async def spy(revoked: set[Any]) -> None:
            if revoked:
                revoking.set()
            await on_revoked(revoked)

        monkeypatch.setattr(first, "_on_revoked", spy)
        second = fast_source(transport, topic, group)
        seen: list[Envelope] = []
        joining = asyncio.create_task(join(second, seen))
        await asyncio.wait_for(revoking.wait(), 30)
        await batch.commit()  # while the revocation waits for it
        await asyncio.wait_for(joining, 30)
        for source in (first, second):
            while await take(source, seen):
                pass
    delivered = Counter(e.message_id for e in [*held, *seen])
    assert set(delivered) == {f"id-{i}" for i in range(total)}
    assert max(delivered.values()) == 1
