"""The RabbitMQ transport against the real broker: round trips, topologies, unroutable messages,
settling, poison, administration. Every test uses its own queues and deletes them afterwards.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest

from bridge.config.models import RabbitMQConnection
from bridge.envelope import MESSAGE_ID, TIME_TO_BE_RECEIVED, Envelope, Headers
from bridge.errors import MessageRejected, MessagesRejected, TransportError, TransportUnavailable
from bridge.transports import load
from bridge.transports.rabbitmq import RabbitMQSource, Transport
from bridge.transports.rabbitmq import source as source_module
from bridge.transports.rabbitmq.headers import LAYOUT, NON_PERSISTENT

pytestmark = pytest.mark.integration

Make = Callable[..., Transport]


@pytest.fixture
def channel(rabbitmq_url: str) -> Iterator[Any]:
    """A plain pika channel, as a native client or an NServiceBus endpoint would use."""
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    yield connection.channel()
    connection.close()


@pytest.fixture
def names(rabbitmq_queues: Callable[..., str]) -> Callable[..., str]:
    """Fresh queue names, deleted after the test (tests/conftest.py)."""
    return rabbitmq_queues


@pytest.fixture
def make(rabbitmq_transports: Make) -> Make:
    """Transports on the test broker (tests/conftest.py), closed after the test."""
    return rabbitmq_transports


def message(i: int, **extra: str | None) -> Envelope:
    return Envelope(Headers([(MESSAGE_ID, f"id-{i}"), *extra.items()]), f"body-{i}".encode())


async def receive(source: RabbitMQSource, count: int, batch_size: int = 100) -> list[Envelope]:
    got: list[Envelope] = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        batch = await source.receive_batch(batch_size, 1.0)
        async with batch:
            got.extend(batch.messages)
            await batch.commit()
    return got


async def depth_becomes(transport: Transport, queue: str, depth: int) -> None:
    """Wait until `queue` holds `depth` ready messages (requeues after a close are async)."""
    deadline = time.monotonic() + 10
    while (current := (await transport.peek(queue)).depth) != depth:
        assert time.monotonic() < deadline, f"{queue} holds {current} messages, not {depth}"
        await asyncio.sleep(0.02)


def test_the_registry_builds_this_transport(rabbitmq_url: str) -> None:
    config = RabbitMQConnection.model_validate({"type": "rabbitmq", "url": rabbitmq_url})
    assert isinstance(load("rabbit", config), Transport)


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
@pytest.mark.parametrize("topology", ["conventional", "direct"])
async def test_a_thousand_messages_cross_unchanged(
    make: Make, names: Callable[[str], str], topology: str, queue_type: str
) -> None:
    transport = make(topology=topology, queue_type=queue_type)
    queue = names("rt")
    await transport.install([queue])
    now = time.time()
    sent = []
    for i in range(1000):
        envelope = Envelope(
            Headers(
                [
                    ("NServiceBus.MessageId", f"7f1b2c2e-{i:04d}"),
                    ("NServiceBus.ReplyToAddress", "Sales@[dbo]@[nservicebus]"),
                    ("NServiceBus.CorrelationId", f"corr-{i}"),
                    ("NServiceBus.ContentType", "application/json"),
                    ("NServiceBus.EnclosedMessageTypes", "Ns.OrderPlaced, Sales;Ns.IEvent, Sales"),
                    ("zz-unicode", "café / 東京 / \u2028"),
                    ("empty", ""),
                    ("null", None),
                    ("NServiceBus.TimeToBeReceived", "00:10:00"),
                ]
            ),
            bytes([i % 256]) * (i % 700),
            expires_at=now + 600 if i % 2 else None,
        )
        sent.append(envelope)
    sink = transport.sink(queue)
    await sink.send(sent[:500])
    await sink.send(sent[500:])
    source = transport.source(queue)
    got = await receive(source, 1000, batch_size=250)
    assert len(got) == 1000
    received_by = time.time()
    for before, after in zip(sent, got, strict=True):
        assert after.body == before.body
        if queue_type == "classic":
            assert after.headers.items() == before.headers.items()
        else:  # a quorum queue may redeliver, and then sorts the table, for every reader alike
            assert after.headers.to_dict() == before.headers.to_dict()
        if before.expires_at is None:
            assert after.expires_at is None
        else:  # `expiration` counts from receipt: the time spent in the queue is not known
            assert before.expires_at - 0.002 <= (after.expires_at or 0) <= received_by + 600
    assert (await transport.peek(queue)).depth == 0


async def test_what_an_endpoint_receives(
    make: Make, names: Callable[[str], str], channel: Any
) -> None:
    transport = make()
    queue = names("wire")
    await transport.install([queue])
    envelope = message(
        1,
        **{
            "NServiceBus.CorrelationId": "corr-1",
            "NServiceBus.ReplyToAddress": "Sales",
            "NServiceBus.EnclosedMessageTypes": "Ns.OrderPlaced, Sales, Version=1.0.0.0",
            NON_PERSISTENT: "True",
            TIME_TO_BE_RECEIVED: "00:01:00",
        },
    )
    envelope.expires_at = time.time() + 30
    await transport.sink(queue).send([envelope])
    _, properties, body = channel.basic_get(queue, auto_ack=True)
    assert body == b"body-1"
    assert properties.message_id == "id-1"
    assert properties.delivery_mode == 1
    assert properties.correlation_id == "corr-1"
    assert properties.reply_to == "Sales"
    assert properties.content_type == "application/octet-stream"
    assert properties.type == "Ns.OrderPlaced"
    assert 29_000 <= int(properties.expiration) <= 30_000
    assert properties.timestamp is None  # NServiceBus sets none
    headers = properties.headers
    assert headers[MESSAGE_ID] == "id-1"
    assert headers["NServiceBus.ReplyToAddress"] == "Sales"
    assert NON_PERSISTENT not in headers
    assert headers[TIME_TO_BE_RECEIVED] == "00:01:00"  # as the endpoint wrote it
    assert headers.pop("x-delivery-count") == 0  # added by the quorum queue
    assert all(isinstance(value, str) for value in headers.values())
    assert LAYOUT not in headers  # no null value: nothing it would have to carry


async def test_a_native_message_is_read_with_its_properties(
    make: Make, names: Callable[[str], str], channel: Any
) -> None:
    transport = make(topology="direct")
    queue = names("native")
    await transport.install([queue])
    channel.basic_publish(
        "",
        queue,
        b"{}",
        pika.BasicProperties(
            message_id="native-1",
            reply_to="Replies",
            content_type="application/json",
            type="Ns.Ping",
            headers={"n": 7, "flag": True, "raw": b"bytes"},
        ),
    )
    source = transport.source(queue)
    batch = await source.receive_batch(10, 5.0)
    await batch.abort()  # quorum queues add x-delivery-count on redelivery; it is not a header
    (got,) = await receive(source, 1)
    assert got.headers.to_dict() == {
        "flag": "True",
        "n": "7",
        "raw": "bytes",
        "NServiceBus.ReplyToAddress": "Replies",
        "NServiceBus.ContentType": "application/json",
        "NServiceBus.EnclosedMessageTypes": "Ns.Ping",
        MESSAGE_ID: "native-1",
    }
    await source.close()


async def test_an_exchange_without_a_queue_rejects_with_the_index(
    make: Make, names: Callable[[str], str], channel: Any
) -> None:
    transport = make()
    queue = names("unbound")
    channel.exchange_declare(queue, exchange_type="fanout", durable=True)
    sink = transport.sink(queue)
    with pytest.raises(MessagesRejected, match="unroutable") as caught:
        await sink.send([message(i) for i in range(5)])
    assert caught.value.index == 0
    assert [r.index for r in caught.value.rejections] == [0, 1, 2, 3, 4]  # one publish names all
    await transport.install([queue])
    await sink.send([message(9)])  # the same sink goes on once the queue is bound
    assert (await transport.peek(queue)).depth == 1


def headers_exchange(channel: Any, queue: str) -> None:
    """`queue` behind an exchange of its name that routes only messages with header route=yes."""
    channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    channel.exchange_declare(queue, exchange_type="headers", durable=True)
    channel.queue_bind(queue, queue, arguments={"x-match": "all", "route": "yes"})


async def test_every_returned_message_of_a_send_is_named_and_the_rest_is_in_the_queue(
    make: Make, names: Callable[[str], str], channel: Any
) -> None:
    transport = make()
    queue = names("partly")
    headers_exchange(channel, queue)
    sink = transport.sink(queue)
    sent = [message(i, route="yes" if i % 3 == 0 else "no") for i in range(9)]
    with pytest.raises(MessagesRejected, match="6 messages refused") as caught:
        await sink.send(sent)
    assert caught.value.rest_accepted
    assert caught.value.index == 1
    rejections = caught.value.rejections
    assert [r.index for r in rejections] == [1, 2, 4, 5, 7, 8]
    for rejection in rejections:
        assert f"message {rejection.index} (id-{rejection.index}) is unroutable" in str(rejection)
        assert "NO_ROUTE" in str(rejection)
    got = [channel.basic_get(queue, auto_ack=True) for _ in range(3)]
    assert [properties.message_id for _, properties, _ in got] == ["id-0", "id-3", "id-6"]
    assert (await transport.peek(queue)).depth == 0


async def test_direct_topology_to_a_missing_queue_rejects(
    make: Make, names: Callable[[str], str]
) -> None:
    sink = make(topology="direct").sink(names("missing"))
    with pytest.raises(MessageRejected) as caught:
        await sink.send([message(1)])
    assert caught.value.index == 0


async def test_a_missing_exchange_is_not_retriable_and_the_sink_recovers(
    make: Make, names: Callable[[str], str]
) -> None:
    transport = make()
    queue = names("noexchange")
    sink = transport.sink(queue)
    with pytest.raises(TransportError, match="NOT_FOUND") as caught:
        await sink.send([message(1)])
    assert not caught.value.retriable
    await transport.install([queue])
    await sink.send([message(2)])
    assert (await transport.peek(queue)).depth == 1


async def test_an_envelope_without_message_id_is_rejected_before_publishing(
    make: Make, names: Callable[[str], str]
) -> None:
    transport = make()
    queue = names("noid")
    await transport.install([queue])
    broken = Envelope(Headers([("other", "x")]), b"")
    with pytest.raises(MessageRejected) as caught:
        await transport.sink(queue).send([message(0), broken, message(2)])
    assert caught.value.index == 1
    assert (await transport.peek(queue)).depth == 0


async def test_a_steady_trickle_is_handed_over_without_waiting_for_a_full_batch(
    make: Make, names: Callable[[str], str]
) -> None:
    """Deliveries 10 ms apart never pause for `DELIVERY_PAUSE`; a receive still hands over what
    it has `GATHER_LIMIT` after its first delivery instead of waiting for `max_messages`."""
    transport = make()
    queue = names("trickle")
    await transport.install([queue])
    sink = transport.sink(queue)

    async def trickle() -> None:
        for i in range(100):
            await sink.send([message(i)])
            await asyncio.sleep(0.01)

    sending = asyncio.create_task(trickle())
    source = transport.source(queue)
    try:
        batch = await source.receive_batch(1000, 5.0)
        async with batch:
            first = len(batch.messages)
            await batch.commit()
    finally:
        await sending
    assert 1 <= first < 50
    got = await receive(source, 100 - first)
    assert [e.message_id for e in got] == [f"id-{i}" for i in range(first, 100)]


async def test_deliveries_that_waited_through_the_send_before_are_handed_over_at_once(
    make: Make, names: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`GATHER_LIMIT` counts from the oldest waiting delivery's arrival, not from the receive:
    deliveries that came in while the batch before was being sent are not held back a whole
    gathering time more while a trickle keeps coming (here 1 s, and a delivery every 100 ms;
    gathering anew would take about ten of them)."""
    monkeypatch.setattr(source_module, "GATHER_LIMIT", 1.0)
    monkeypatch.setattr(source_module, "DELIVERY_PAUSE", 60.0)
    transport = make()
    queue = names("waited")
    await transport.install([queue])
    sink = transport.sink(queue)
    source = transport.source(queue)
    await sink.send([message(0)])
    first = await source.receive_batch(1000, 5.0)  # starts the consumer; gathers for 1 s
    await first.commit()
    await sink.send([message(i) for i in range(1, 4)])
    await depth_becomes(transport, queue, 0)  # all three prefetched by the consumer
    await asyncio.sleep(1.5)  # longer than GATHER_LIMIT, as a slow send before would be

    async def trickle() -> None:
        for i in range(4, 34):
            await sink.send([message(i)])
            await asyncio.sleep(0.1)

    sending = asyncio.create_task(trickle())
    try:
        batch = await source.receive_batch(1000, 5.0)
        async with batch:
            taken = [e.message_id for e in batch.messages]
            await batch.commit()
    finally:
        await sending
    assert taken[:3] == ["id-1", "id-2", "id-3"]
    assert len(taken) <= 6, taken  # what came meanwhile, with 300 ms to spare; not ten more
    rest = await receive(source, 33 - len(taken))
    assert [e.message_id for e in rest] == [f"id-{i}" for i in range(1 + len(taken), 34)]


async def test_batches_settled_out_of_order_ack_only_their_own(
    make: Make, names: Callable[[str], str]
) -> None:
    transport = make()
    queue = names("overlap")
    await transport.install([queue])
    await transport.sink(queue).send([message(i) for i in range(6)])
    source = transport.source(queue)
    older = await source.receive_batch(3, 5.0)
    newer = await source.receive_batch(3, 5.0)
    await newer.commit()
    await older.abort()
    got = await receive(source, 3)
    assert [e.message_id for e in got] == ["id-0", "id-1", "id-2"]


async def test_a_source_whose_queue_is_deleted_says_so_and_recovers(
    make: Make, names: Callable[[str], str], channel: Any
) -> None:
    transport = make()
    queue = names("deleted")
    await transport.install([queue])
    source = transport.source(queue)
    assert not (await source.receive_batch(10, 0.1)).messages  # consuming
    channel.queue_delete(queue)  # the broker cancels the consumer
    with pytest.raises(TransportError, match="NOT_FOUND") as caught:
        while True:  # until the cancel arrived
            await (await source.receive_batch(10, 0.1)).abort()
    assert not caught.value.retriable
    await transport.install([queue])
    await transport.sink(queue).send([message(1)])
    assert [e.message_id for e in await receive(source, 1)] == ["id-1"]


async def test_poison_goes_to_the_error_queue_byte_for_byte(
    make: Make, names: Callable[[str], str], channel: Any
) -> None:
    transport = make(topology="direct")
    queue, errors = names("poison"), names("errors")
    await transport.install([queue, errors])
    unreadable = {"h": b"\xff", b"\xfe name": "v"}  # a header name that is not UTF-8
    channel.basic_publish(
        "", queue, b"\x00raw", pika.BasicProperties(app_id="legacy", headers=unreadable)
    )
    channel.basic_publish("", queue, b"fine", pika.BasicProperties(message_id="ok-1"))
    replaced = pika.BasicProperties(message_id="ok-2", headers={"h": b"ok \xff"})
    channel.basic_publish("", queue, b"fine", replaced)
    source = transport.source(queue, error_queue=errors)
    batch = await source.receive_batch(10, 5.0)
    while len(batch) < 3:
        await batch.abort()
        batch = await source.receive_batch(10, 5.0)
    assert [e.message_id for e in batch.messages] == ["ok-1", "ok-2"]
    # A value that is not UTF-8 reads with replacement characters, as NServiceBus reads it.
    assert batch.messages[1].headers.get("h") == "ok \ufffd"
    (poison,) = batch.poison
    assert "not UTF-8" in poison.reason
    await batch.commit()
    assert (await transport.peek(queue)).depth == 0
    _, properties, body = channel.basic_get(errors, auto_ack=True)
    assert body == b"\x00raw"
    assert properties.app_id == "legacy"
    assert properties.headers["h"] == b"\xff"
    assert properties.headers[b"\xfe name"] == "v"
    assert properties.headers["NServiceBus.FailedQ"] == queue
    assert properties.headers["NServiceBus.ExceptionInfo.ExceptionType"] == "HeadersFormatError"
    assert properties.headers["NServiceBus.TimeOfFailure"].endswith(" Z")
    assert properties.message_id == properties.headers[MESSAGE_ID]


async def test_error_queue_copies_do_not_expire(
    make: Make, names: Callable[[str], str], channel: Any
) -> None:
    """Copies of a poison and a rejected message that had a time to live stay in the error queue
    after a message published ahead of them with that same time to live expired there."""
    transport = make(topology="direct", queue_type="classic")
    queue, errors = names("ttl"), names("errors")
    await transport.install([queue, errors])
    source = transport.source(queue, error_queue=errors)
    await (await source.receive_batch(10, 0.1)).commit()  # consuming: nothing waits to expire
    ttl = pika.BasicProperties(expiration="2000", headers={"h": b"\xff"})
    channel.basic_publish("", queue, b"poison", ttl)
    expiring = message(1)
    expiring.expires_at = time.time() + 2
    await transport.sink(queue).send([expiring])
    batch = await source.receive_batch(10, 5.0)
    while len(batch) < 2:
        await batch.abort()
        batch = await source.receive_batch(10, 5.0)
    (rejected,) = batch.messages
    assert rejected.expires_at is not None
    batch.reject(rejected, MessageRejected("refused", index=0))
    channel.basic_publish("", errors, b"ahead", pika.BasicProperties(expiration="2000"))
    await batch.commit()
    await depth_becomes(transport, errors, 2)  # "ahead" expired; the copies are there
    copies = [channel.basic_get(errors, auto_ack=True) for _ in range(2)]
    assert [body for _, _, body in copies] == [b"poison", b"body-1"]
    for _, properties, _ in copies:
        assert properties.expiration is None
        assert properties.headers["NServiceBus.FailedQ"] == queue
    await source.close()


async def test_a_missing_error_queue_fails_the_commit_and_keeps_the_batch(
    make: Make, names: Callable[[str], str], channel: Any
) -> None:
    transport = make()
    queue = names("noerrq")
    await transport.install([queue])
    channel.basic_publish(queue, "", b"no id", pika.BasicProperties())
    source = transport.source(queue, error_queue=names("absent"))
    batch = await source.receive_batch(10, 5.0)
    assert len(batch.poison) == 1
    with pytest.raises(TransportError, match="absent"):
        async with batch:
            await batch.commit()
    await source.close()
    await depth_becomes(transport, queue, 1)


def refusing_queue(channel: Any, queue: str) -> None:
    """A queue the broker nacks every publish to (a full queue that rejects, not drops; a quorum
    queue takes one message over its limit first)."""
    arguments = {"x-queue-type": "classic", "x-max-length": 0, "x-overflow": "reject-publish"}
    channel.queue_declare(queue, durable=True, arguments=arguments)


async def test_an_error_queue_that_refuses_leaves_the_poison_message_at_the_source(
    make: Make, names: Callable[[str], str], channel: Any
) -> None:
    """A commit whose error-queue copy the broker nacked returns the batch at once: the next
    batch's multiple-ack must not acknowledge the poison message with it."""
    transport = make(queue_type="classic")
    queue, errors = names("refused"), names("errors")
    refusing_queue(channel, errors)
    await transport.install([queue, errors])
    channel.basic_publish(queue, "", b"no id", pika.BasicProperties())
    for i in range(3):
        channel.basic_publish(queue, "", b"fine", pika.BasicProperties(message_id=f"ok-{i}"))
    source = transport.source(queue, error_queue=errors)
    batch = await source.receive_batch(1, 5.0)
    assert len(batch.poison) == 1
    with pytest.raises(TransportUnavailable, match="refused 1 error-queue copies") as caught:
        async with batch:
            await batch.commit()
    assert caught.value.retriable
    assert batch.settled == "failed"
    later = await source.receive_batch(10, 5.0)  # the poison message comes first again
    while len(later) < 4:
        await later.abort()
        later = await source.receive_batch(10, 5.0)
    assert len(later.poison) == 1
    assert [e.message_id for e in later.messages] == ["ok-0", "ok-1", "ok-2"]
    with pytest.raises(TransportUnavailable):
        await later.commit()
    await depth_becomes(transport, queue, 4)
    channel.queue_delete(errors)
    await transport.install([errors])  # now the error queue takes the copy
    got = await receive(source, 3)
    assert [e.message_id for e in got] == ["ok-0", "ok-1", "ok-2"]
    await depth_becomes(transport, queue, 0)
    await depth_becomes(transport, errors, 1)
    _, properties, body = channel.basic_get(errors, auto_ack=True)
    assert body == b"no id"
    assert properties.headers["NServiceBus.FailedQ"] == queue


async def test_a_failed_commit_of_an_older_batch_is_not_acknowledged_by_a_newer_one(
    make: Make, names: Callable[[str], str], channel: Any
) -> None:
    transport = make(queue_type="classic")
    queue, errors = names("overlapfail"), names("errors")
    refusing_queue(channel, errors)
    await transport.install([queue, errors])
    channel.basic_publish(queue, "", b"no id", pika.BasicProperties())
    channel.basic_publish(queue, "", b"fine", pika.BasicProperties(message_id="ok-1"))
    source = transport.source(queue, error_queue=errors)
    older = await source.receive_batch(1, 5.0)
    newer = await source.receive_batch(1, 5.0)
    assert len(older.poison) == 1
    assert [e.message_id for e in newer.messages] == ["ok-1"]
    with pytest.raises(TransportUnavailable):
        await older.commit()
    await newer.commit()  # acknowledges its own delivery, not the older poison one
    await source.close()
    await depth_becomes(transport, queue, 1)
    again = transport.source(queue, error_queue=errors)
    batch = await again.receive_batch(10, 5.0)
    assert len(batch.poison) == 1 and not batch.messages
    await batch.abort()
    await again.close()


@pytest.mark.parametrize(("existing", "wanted"), [("classic", "quorum"), ("quorum", "classic")])
async def test_a_queue_of_another_type_is_a_clear_error(
    make: Make, names: Callable[[str], str], existing: str, wanted: str
) -> None:
    queue = names("kind")
    await make(queue_type=existing).install([queue])
    transport = make(queue_type=wanted)
    with pytest.raises(TransportError) as caught:
        await transport.install([queue])
    text = str(caught.value)
    assert f"queue {queue!r} already exists as a {existing} queue" in text
    assert f"queue_type is {wanted}" in text
    assert not caught.value.retriable
    (warning,) = await transport.check([queue])
    assert f"a {existing} queue" in warning
    assert (await transport.peek(queue)).depth == 0  # the admin channel came back


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
async def test_install_keeps_the_other_arguments_of_an_existing_queue(
    make: Make, names: Callable[[str], str], channel: Any, queue_type: str
) -> None:
    queue = names("args")
    arguments = {
        "x-queue-type": queue_type,
        "x-dead-letter-exchange": "dlx 'quoted'",
        "x-max-length": 10,
        "x-overflow": "reject-publish",
    }
    channel.queue_declare(queue, durable=True, arguments=arguments)
    transport = make(queue_type=queue_type)
    await transport.install([queue])
    assert await transport.check([queue]) == []
    other = "classic" if queue_type == "quorum" else "quorum"
    with pytest.raises(TransportError, match=f"already exists as a {queue_type} queue"):
        await make(queue_type=other).install([queue])


async def test_check_names_every_missing_queue_and_exchange(
    make: Make, names: Callable[[str], str]
) -> None:
    transport = make()
    present, absent = names("here"), names("gone")
    await transport.install([present])
    with pytest.raises(TransportError) as caught:
        await transport.check([present, absent])
    assert str(caught.value) == (
        f"rabbitmq connection 'rabbit': missing queue {absent!r}, exchange {absent!r}; "
        "run `bridge install`"
    )
    with pytest.raises(TransportError, match="does not exist"):
        await transport.peek(absent)


def amqp_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("bridge-amqp")]


async def test_no_connection_outlives_close_or_a_dropped_sink(
    make: Make, names: Callable[[str], str]
) -> None:
    before = set(amqp_threads())
    transport = make()
    queue = names("threads")
    await transport.install([queue])
    await transport.sink(queue).send([message(1)])  # a sink nobody closes
    gc.collect()
    source = transport.source(queue)
    await (await source.receive_batch(10, 5.0)).commit()
    await transport.close()
    deadline = time.monotonic() + 10
    while left := set(amqp_threads()) - before:
        assert time.monotonic() < deadline, left
        await asyncio.sleep(0.02)


async def test_a_refused_login_is_not_retriable(rabbitmq_url: str) -> None:
    url = rabbitmq_url.replace("guest:guest@", "guest:wrong@")
    transport = Transport(
        "badlogin", RabbitMQConnection.model_validate({"type": "rabbitmq", "url": url})
    )
    try:
        with pytest.raises(TransportError) as caught:
            await transport.peek("q")
        assert not caught.value.retriable
        assert "wrong" not in str(caught.value)
    finally:
        await transport.close()
