"""Delays the bridge is asked for, carried out by RabbitMQ's v2 delay infrastructure against the
real broker: the message waits in the level NServiceBus would put it in, with its routing key,
arrives no earlier than asked and not much later, and the bridge declares the infrastructure
exactly as NServiceBus RabbitMQ does (DelayInfrastructure.cs:27-67), so both share it."""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import pika
import pytest

from bridge.envelope import Envelope, Headers
from bridge.transports.rabbitmq import Transport
from bridge.transports.rabbitmq.delays import DELIVERY_EXCHANGE, declarations, level_name
from tests.support.management import api

pytestmark = pytest.mark.integration

Make = Callable[..., Transport]

DELAY = 3


@pytest.fixture
def make(rabbitmq_transports: Make) -> Make:
    """Transports on the test broker (tests/conftest.py), closed after the test."""
    return rabbitmq_transports


def waiting_in(level: int, queue: str) -> list[dict[str, Any]]:
    """The messages for `queue` waiting in a level, looked at and put back (management API)."""
    name = urllib.parse.quote(level_name(level), safe="")
    got = api(
        "POST",
        f"queues/%2F/{name}/get",
        {"count": 1000, "ackmode": "reject_requeue_true", "encoding": "auto"},
    )
    return [m for m in got if m["routing_key"].endswith("." + queue)]


def take(url: str, queue: str) -> list[tuple[float, pika.BasicProperties]]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    got = []
    while True:
        method, properties, _ = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append((time.time(), properties))
    connection.close()
    return got


@pytest.mark.parametrize("topology", ["conventional", "direct"])
async def test_a_delayed_message_waits_in_its_level_and_arrives_when_due(
    make: Callable[..., Transport],
    rabbitmq_url: str,
    rabbitmq_queues: Callable[..., str],
    topology: str,
) -> None:
    queue = rabbitmq_queues("Delayed")
    transport = make(topology=topology)
    await transport.install([queue])
    sink = transport.sink(queue)
    sent = time.time()
    headers = Headers([("NServiceBus.MessageId", "d1")])
    await sink.send([Envelope(headers, b"{}", deliver_at=sent + DELAY)])
    await sink.close()

    # 3 s = 0b11: level 01, routing key ...1.1.<queue>, the delay header an Int32 of 3.
    (waiting,) = waiting_in(1, queue)
    assert waiting["exchange"] == level_name(1)
    assert waiting["routing_key"] == "0." * 26 + f"1.1.{queue}"
    assert waiting["properties"]["headers"]["NServiceBus.Transport.RabbitMQ.DelayInSeconds"] == 3
    assert take(rabbitmq_url, queue) == []
    # `bridge peek` counts it among the delay levels' messages (every destination's: which are
    # this queue's only taking them would tell), not in the queue's depth.
    assert (await transport.peek(queue)).depth == 0
    assert await transport.delayed_all_destinations() >= 1

    deadline = time.monotonic() + DELAY + 10
    got: list[tuple[float, pika.BasicProperties]] = []
    while not got and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        got = await asyncio.to_thread(take, rabbitmq_url, queue)
    assert len(got) == 1, "the delayed message never arrived"
    arrived, properties = got[0]
    assert properties.message_id == "d1"
    lateness = arrived - (sent + DELAY)
    assert lateness >= 0, f"arrived {-lateness:.2f} s early"
    assert lateness < 3, f"arrived {lateness:.2f} s late"


async def test_the_infrastructure_is_what_nservicebus_declares(
    make: Callable[..., Transport], rabbitmq_url: str, rabbitmq_queues: Callable[..., str]
) -> None:
    """After a delayed send, every exchange, queue and binding of DelayInfrastructure.Build
    exists as declared there (a second declaration, as an NServiceBus endpoint would make at
    start, is accepted: an argument differing would be refused with 406), and the destination
    is bound to the delivery exchange with `#.<queue>`."""
    queue = rabbitmq_queues("Delayed")
    transport = make()
    await transport.install([queue])
    sink = transport.sink(queue)
    headers = Headers([("NServiceBus.MessageId", "d2")])
    await sink.send([Envelope(headers, b"{}", deliver_at=time.time() + 1)])
    await sink.close()
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    channel = connection.channel()
    for d in declarations():
        if d.kind == "exchange":
            channel.exchange_declare(d.name, exchange_type="topic", durable=True)
        elif d.kind == "queue":
            channel.queue_declare(d.name, durable=True, arguments=d.arguments)
    connection.close()
    bindings = api("GET", "bindings/%2F")
    have = {(b["source"], b["destination"], b["routing_key"]) for b in bindings}
    wanted = {(d.source, d.name, d.routing_key) for d in declarations() if "bind" in d.kind}
    assert wanted <= have
    assert (level_name(0), DELIVERY_EXCHANGE, "*." * 27 + "0.#") in have
    assert (DELIVERY_EXCHANGE, queue, f"#.{queue}") in have


def delete_delay_binding(queue: str, topology: str) -> None:
    """Delete the destination's binding to the delivery exchange, as an operator might
    (management API)."""
    kind = "q" if topology == "direct" else "e"
    where = f"bindings/%2F/e/{DELIVERY_EXCHANGE}/{kind}/{urllib.parse.quote(queue, safe='')}"
    (binding,) = api("GET", where)
    api("DELETE", f"{where}/{urllib.parse.quote(binding['properties_key'], safe='')}")
    assert api("GET", where) == []


async def arrived(url: str, queue: str, seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    got: list[tuple[float, pika.BasicProperties]] = []
    while not got and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        got = await asyncio.to_thread(take, url, queue)
    return [properties.message_id for _, properties in got]


@pytest.mark.parametrize("topology", ["conventional", "direct"])
async def test_a_delay_binding_deleted_while_the_sink_runs_is_made_again_before_a_delayed_send(
    make: Callable[..., Transport],
    rabbitmq_url: str,
    rabbitmq_queues: Callable[..., str],
    topology: str,
) -> None:
    """NServiceBus binds the destination to `nsb.v2.delay-delivery` before each delayed send
    (Connection/ConfirmsAwareChannel.cs:41 of Particular/NServiceBus.RabbitMQ@ec745bf8): a
    binding deleted meanwhile would otherwise drop every delayed message at the delivery
    exchange, unroutable. The sink binds before each send that holds a delayed message."""
    queue = rabbitmq_queues("Delayed")
    transport = make(topology=topology)
    await transport.install([queue])
    sink = transport.sink(queue)
    try:
        headers = Headers([("NServiceBus.MessageId", "first")])
        await sink.send([Envelope(headers, b"{}", deliver_at=time.time() + 1)])
        assert await arrived(rabbitmq_url, queue, 10) == ["first"]
        await asyncio.to_thread(delete_delay_binding, queue, topology)
        headers = Headers([("NServiceBus.MessageId", "after")])
        await sink.send([Envelope(headers, b"{}", deliver_at=time.time() + 1)])
        assert await arrived(rabbitmq_url, queue, 10) == ["after"]
    finally:
        await sink.close()
