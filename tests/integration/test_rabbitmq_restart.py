"""A RabbitMQ restart in the middle of a stream loses nothing (`rabbitmqctl stop_app/start_app`).

The loop below does what the route runner does: receive, hand the batch to the destination
(here: a list), commit; on a retriable error back off and go on. Duplicates may only come from
the batch in flight when the broker went away.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator, Iterator

import pika
import pytest

from bridge.config.models import RabbitMQConnection
from bridge.envelope import MESSAGE_ID, Envelope, Headers
from bridge.errors import TransportUnavailable
from bridge.transports.rabbitmq import Transport
from tests.conftest import unique

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BATCH = 50


async def rabbitmqctl(*args: str) -> None:
    executable = shutil.which("rabbitmqctl")
    if executable is None:
        pytest.fail("rabbitmqctl is needed to restart the broker")
    process = await asyncio.create_subprocess_exec(
        executable,
        *args,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await process.communicate()
    assert process.returncode == 0, f"rabbitmqctl {' '.join(args)}: {stderr.decode()}"


async def start_when(noticed: asyncio.Event) -> None:
    """Keep the broker down until the bridge noticed, then start it again."""
    await noticed.wait()
    await rabbitmqctl("start_app")
    await rabbitmqctl("await_startup")


@pytest.fixture
async def broker_restored() -> AsyncIterator[None]:
    """Whatever the test does, the broker runs again afterwards."""
    yield
    await rabbitmqctl("start_app")
    await rabbitmqctl("await_startup")


@pytest.fixture
def queue(rabbitmq_url: str) -> Iterator[str]:
    name = unique("restart")
    yield name
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    channel = connection.channel()
    channel.queue_delete(name)
    channel.exchange_delete(name)
    connection.close()


@pytest.fixture
async def transport(rabbitmq_url: str) -> AsyncIterator[Transport]:
    config = RabbitMQConnection.model_validate({"type": "rabbitmq", "url": rabbitmq_url})
    transport = Transport("rabbit", config)
    yield transport
    await transport.close()


async def test_a_broker_restart_mid_stream_loses_nothing(
    broker_restored: None, transport: Transport, queue: str
) -> None:
    await transport.install([queue])
    sink = transport.sink(queue)
    expected = [f"id-{i}" for i in range(2000)]
    await sink.send(
        [Envelope(Headers([(MESSAGE_ID, i)]), i.encode() * 100) for i in expected[:1000]]
    )
    await sink.send(
        [Envelope(Headers([(MESSAGE_ID, i)]), i.encode() * 100) for i in expected[1000:]]
    )

    source = transport.source(queue)
    forwarded: list[str] = []
    failures: list[str] = []
    noticed = asyncio.Event()
    broker_up: asyncio.Task[None] | None = None
    deadline = time.monotonic() + 120
    while set(forwarded) != set(expected):
        assert time.monotonic() < deadline, f"{len(set(forwarded))} of 2000 after 120s"
        try:
            batch = await source.receive_batch(BATCH, 1.0)
            async with batch:
                forwarded.extend(e.message_id or "" for e in batch.messages)  # "destination"
                if broker_up is None and len(forwarded) >= 600:
                    await rabbitmqctl("stop_app")  # this batch and the prefetched are unacked
                    broker_up = asyncio.create_task(start_when(noticed))
                await batch.commit()
        except TransportUnavailable as exc:
            failures.append(str(exc))
            noticed.set()
            await asyncio.sleep(0.1)  # the runner's backoff
    assert broker_up is not None
    await asyncio.wait_for(broker_up, 60)

    assert failures, "the outage went unnoticed"
    assert set(forwarded) == set(expected)
    assert 0 < len(forwarded) - len(expected) <= BATCH  # the batch in hand comes again
    assert (await transport.peek(queue)).depth == 0

    await sink.send([Envelope(Headers([(MESSAGE_ID, "after")]), b"")])  # the sink reconnects
    batch = await source.receive_batch(BATCH, 5.0)
    assert [e.message_id for e in batch.messages] == ["after"]
    await batch.commit()
    await source.close()
