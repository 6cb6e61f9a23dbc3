"""The seam `pika_coalesce_writes` (bridge/transports/rabbitmq/coalesce_writes.py) against the
real broker: the frames of a publish are joined into few writes, and a batch published with
or without joining arrives complete, in order and byte for byte the same. Both
implementations are put in place directly, whatever `BRIDGE_SPEEDUPS_OFF` says.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pika
import pytest

from bridge.config.models import RabbitMQConnection
from bridge.envelope import MESSAGE_ID, Envelope, Headers
from bridge.transports.rabbitmq import Transport, coalesce_writes
from bridge.transports.rabbitmq import session as session_module
from bridge.transports.rabbitmq.config import CONFIRM_TIMEOUT
from bridge.transports.rabbitmq.confirms import Message
from bridge.transports.rabbitmq.connection import Link, parameters
from bridge.transports.rabbitmq.headers import incoming, outgoing

pytestmark = pytest.mark.integration

Coalesce = Callable[[Any], None]


@pytest.fixture
def queues(rabbitmq_queues: Callable[..., str]) -> Callable[..., str]:
    """Fresh queue names, deleted after the test (tests/conftest.py)."""
    return rabbitmq_queues


@pytest.fixture
async def transport(rabbitmq_url: str) -> AsyncIterator[Transport]:
    config = RabbitMQConnection.model_validate({"type": "rabbitmq", "url": rabbitmq_url})
    made = Transport("rabbit", config)
    yield made
    await made.close()


def spying(coalesce: Coalesce, seen: list[tuple[list[int], list[int]]]) -> Coalesce:
    """`coalesce`, recording the sizes of pika's buffers before and after it ran."""

    def spy(connection: Any) -> None:
        before = [len(b) for b in connection._transport._tx_buffers]
        coalesce(connection)
        seen.append((before, [len(b) for b in connection._transport._tx_buffers]))

    return spy


def drain(rabbitmq_url: str, queue: str, count: int) -> list[tuple[bytes, bytes]]:
    """The `count` messages in `queue` as (properties encoded by pika, body), in queue order;
    fails when there are more."""
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    channel = connection.channel()
    got: list[tuple[bytes, bytes]] = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            time.sleep(0.05)
            continue
        got.append((b"".join(properties.encode()), body))
    assert channel.basic_get(queue, auto_ack=True)[0] is None
    connection.close()
    return got


@pytest.mark.tuning("pins the write coalescing through pika internals; arriving whole is behaviour")
async def test_a_batch_goes_to_the_socket_in_few_writes_and_arrives_whole(
    transport: Transport, queues: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The frames of a published batch are joined before pika writes them (fails when pika no
    longer buffers its writes where the seam looks for them: every frame would be a send)."""
    queue = queues("writes")
    await transport.install([queue])
    buffers: list[tuple[list[int], list[int]]] = []
    monkeypatch.setattr(
        session_module, "coalesce_writes", spying(coalesce_writes.coalesced, buffers)
    )
    # Bodies up to 1.05 frames: some messages have two body frames.
    sent = [
        Envelope(Headers([(MESSAGE_ID, f"id-{i}")]), bytes([i]) * (i * 1700)) for i in range(80)
    ]
    await transport.sink(queue).send(sent)
    [(before, after)] = buffers
    assert len(before) >= 2 * len(sent)  # method and header frames at least, body frames too
    chunk = coalesce_writes.WRITE_CHUNK
    assert sum(after) == sum(before) and max(after) <= chunk
    assert all(a + b > chunk for a, b in itertools.pairwise(after))  # none left to join
    source = transport.source(queue)
    got: list[Envelope] = []
    deadline = time.monotonic() + 30
    while len(got) < len(sent) and time.monotonic() < deadline:
        async with await source.receive_batch(100, 1.0) as batch:
            got.extend(batch.messages)
            await batch.commit()
    assert [(e.message_id, e.body) for e in got] == [(e.message_id, e.body) for e in sent]


def batch(now: float) -> list[Message]:
    """One batch of NServiceBus-like messages: unicode, nulls, lifetimes, multi-frame bodies."""
    messages: list[Message] = []
    for i in range(120):
        headers = Headers(
            [
                (MESSAGE_ID, f"7f1b2c2e-{i:04d}"),
                ("NServiceBus.CorrelationId", f"corr-{i}"),
                ("NServiceBus.EnclosedMessageTypes", "Ns.OrderPlaced, Sales;Ns.IEvent, Sales"),
                ("zz-unicode", "café / 東京 / \u2028" * (i % 5)),
                ("null", None),
            ]
        )
        body = bytes([i % 256]) * (i * 1_300)  # up to 1.2 frames
        messages.append(
            outgoing(Envelope(headers, body, expires_at=now + 600 if i % 2 else None), now)
        )
    return messages


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
async def test_a_batch_arrives_the_same_with_and_without_coalescing(
    rabbitmq_url: str,
    queues: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    queue_type: str,
) -> None:
    config = RabbitMQConnection.model_validate(
        {"type": "rabbitmq", "url": rabbitmq_url, "topology": "direct", "queue_type": queue_type}
    )
    transport = Transport("rabbit", config)
    sent = batch(time.time())
    received: dict[str, list[tuple[bytes, bytes]]] = {}
    try:
        for coalesce in (coalesce_writes.coalesced, coalesce_writes.uncoalesced):
            queue = queues(coalesce.__name__)
            await transport.install([queue])
            buffers: list[tuple[list[int], list[int]]] = []
            monkeypatch.setattr(session_module, "coalesce_writes", spying(coalesce, buffers))
            link = Link(parameters(config, "rabbit", "sink"), queue, confirm=True)
            try:
                outcome = await link.publish("", queue, sent, timeout=CONFIRM_TIMEOUT)
            finally:
                await link.close()
            assert not outcome.returned and not outcome.nacked
            [(before, after)] = buffers
            assert (len(after) < len(before)) == (coalesce is coalesce_writes.coalesced)
            received[coalesce.__name__] = drain(rabbitmq_url, queue, len(sent))
    finally:
        await transport.close()
    assert received["coalesced"] == received["uncoalesced"]
    # Complete and in order: each message reads back as the envelope that was sent (a quorum
    # queue hands the headers over sorted by name).
    assert [read(encoded, body) for encoded, body in received["coalesced"]] == [
        read(b"".join(properties.encode()), body) for properties, body in sent
    ]


def read(encoded: bytes, body: bytes) -> tuple[dict[str, str | None], bytes, float | None]:
    envelope = incoming(pika_decoded(encoded), body, 0.0)
    return envelope.headers.to_dict(), envelope.body, envelope.expires_at


def pika_decoded(encoded: bytes) -> pika.BasicProperties:
    properties = pika.BasicProperties()
    properties.decode(encoded)
    return properties
