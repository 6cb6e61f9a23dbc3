"""Quorum source queues' delivery limits against the real broker and its management API
(rabbitmq/delivery_limit.py), as NServiceBus RabbitMQ's BrokerVerifier checks them.

Source read: Particular/NServiceBus.RabbitMQ@ec745bf, src/NServiceBus.Transport.RabbitMQ/
Administration/BrokerVerifier.cs (BV), ManagementApi/Models/Queue.cs, ManagementApi/
ManagementClient.cs; Receiving/MessagePump.cs:97 checks each receive queue at start.

The broker here is RabbitMQ 3.10 (Debian's), with the management plugin that
`scripts/bootstrap --services` enables. Quorum queues have no default delivery limit before
RabbitMQ 4.0, so NServiceBus creates no policy on it (Queue.cs:68, BV:173-176), and 3.10 could
not take one (`apply-to: quorum_queues` is refused before 3.12): the policy the bridge creates
on RabbitMQ 4 is pinned in tests/unit/test_rabbitmq_delivery_limit.py. Here: the limits that
someone set are refused (BV:183-186), an unreachable management API refuses quorum sources
(BV:48-51, 148-151), classic queues never reach the API (BV:166-169), and a limited queue
really drops what the bridge returns to it once the check is switched off.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import pytest

from bridge.config.loader import load_config
from bridge.errors import AccessRefused, TransportError
from bridge.transports import load
from bridge.transports.rabbitmq import RabbitMQSource, Transport
from bridge.transports.rabbitmq.delivery_limit import policy_name
from tests.conftest import unique
from tests.support.management import api

pytestmark = pytest.mark.integration

Make = Callable[..., Transport]


def closed_port() -> int:
    """A local port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def channel(rabbitmq_url: str) -> Iterator[Any]:
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    yield connection.channel()
    connection.close()


@pytest.fixture
def make(rabbitmq_transports: Make) -> Make:
    """Transports on the test broker (tests/conftest.py), closed after the test."""
    return rabbitmq_transports


@pytest.fixture
def policies() -> Iterator[Callable[[str, dict[str, Any]], str]]:
    """User policies made by a test, deleted after it."""
    made: list[str] = []

    def put(queue: str, definition: dict[str, Any]) -> str:
        name = unique("bridge-test")
        body = {"pattern": f"^{queue}$", "apply-to": "queues", "definition": definition}
        api("PUT", f"policies/%2F/{name}", body)
        made.append(name)
        return name

    yield put
    for name in made:
        api("DELETE", f"policies/%2F/{name}")


def declare(channel: Any, queue: str, **arguments: object) -> None:
    channel.queue_declare(queue, durable=True, arguments=arguments)


def publish(channel: Any, queue: str, count: int = 1) -> None:
    for i in range(count):
        props = pika.BasicProperties(message_id=f"id-{i}", delivery_mode=2)
        channel.basic_publish("", queue, f"body-{i}".encode(), props)


def nsb_policies() -> list[str]:
    return [p["name"] for p in api("GET", "policies/%2F") if p["name"].startswith("nsb.")]


def depth(queue: str, channel: Any) -> int:
    return int(channel.queue_declare(queue, passive=True).method.message_count)


async def first_receive(source: RabbitMQSource) -> int:
    batch = await source.receive_batch(10, 2.0)
    async with batch:
        await batch.abort()
    return len(batch.messages)


async def test_a_quorum_queue_limited_by_its_argument_is_refused_with_its_messages_kept(
    make: Make, rabbitmq_queues: Callable[..., str], channel: Any
) -> None:
    """BV:183-186: a delivery limit in the queue's arguments is an error naming the queue."""
    queue = rabbitmq_queues("Limited")
    declare(channel, queue, **{"x-queue-type": "quorum", "x-delivery-limit": 2})
    publish(channel, queue)

    with pytest.raises(TransportError) as refused:
        await first_receive(make().source(queue))
    assert str(refused.value).startswith(
        f"rabbitmq connection 'rabbit': quorum queue {queue!r} has a delivery limit of 2, set "
        "by its x-delivery-limit argument (2); the bridge returns a batch to its queue "
        "whenever a send fails"
    )
    assert "remove the x-delivery-limit argument" in str(refused.value)
    assert depth(queue, channel) == 1  # never consumed


async def test_a_quorum_queue_limited_by_a_policy_is_refused(
    make: Make,
    rabbitmq_queues: Callable[..., str],
    channel: Any,
    policies: Callable[[str, dict[str, Any]], str],
) -> None:
    """BV:183-186: the effective policy's delivery-limit too, found once the management
    database knows the queue (BV:133-162 waits for that)."""
    queue = rabbitmq_queues("PolicyLimited")
    declare(channel, queue, **{"x-queue-type": "quorum"})
    policy = policies(queue, {"delivery-limit": 4})

    with pytest.raises(TransportError) as refused:
        await first_receive(make().source(queue))
    assert f"has a delivery limit of 4, set by policy {policy!r} (delivery-limit 4)" in str(
        refused.value
    )


async def test_a_quorum_queue_without_a_limit_is_consumed_and_gets_no_policy_on_rabbitmq_3(
    make: Make, rabbitmq_queues: Callable[..., str], channel: Any
) -> None:
    """RabbitMQ 3 quorum queues have no default limit: nothing to do (Queue.cs:68, BV:173-176),
    and `bridge install` on the same queue leaves it so."""
    assert api("GET", "overview")["rabbitmq_version"].startswith("3.")
    queue = rabbitmq_queues("Unlimited")
    transport = make()
    await transport.install([queue])
    publish(channel, queue, 3)

    assert await transport.prepare_sources([queue]) == []
    assert await first_receive(transport.source(queue)) == 3
    assert policy_name(queue) not in nsb_policies()


async def test_classic_queues_never_reach_the_management_api(
    make: Make, rabbitmq_queues: Callable[..., str], channel: Any
) -> None:
    """BV:166-169: only quorum queues are checked. A classic connection does not even ask (its
    management API here is a port nothing listens on); a quorum connection whose queue exists
    as classic asks, and leaves it alone."""
    nowhere = f"http://127.0.0.1:{closed_port()}/"
    classic = rabbitmq_queues("Classic")
    declare(channel, classic, **{"x-queue-type": "classic"})
    publish(channel, classic, 2)

    transport = make(queue_type="classic", management_url=nowhere)
    assert await transport.prepare_sources([classic]) == []
    assert await first_receive(transport.source(classic)) == 2

    assert await first_receive(make().source(classic)) == 2
    assert api("GET", f"queues/%2F/{quote(classic, safe='')}").get("policy") is None


async def test_a_source_checks_again_when_it_consumes_on_a_new_connection(
    make: Make,
    rabbitmq_queues: Callable[..., str],
    channel: Any,
    policies: Callable[[str, dict[str, Any]], str],
) -> None:
    """Checked when the source first consumes (MessagePump.cs:97) and again after its
    connection was lost (a broker upgrade to 4.x restarts it, and 4.x limits by default)."""
    queue = rabbitmq_queues("Rechecked")
    declare(channel, queue, **{"x-queue-type": "quorum"})
    publish(channel, queue)
    source = make().source(queue)
    batch = await source.receive_batch(10, 2.0)
    async with batch:
        await batch.commit()  # the consumer stays
    assert len(batch.messages) == 1

    policy = policies(queue, {"delivery-limit": 3})
    path = f"queues/%2F/{quote(queue, safe='')}"
    deadline = time.monotonic() + 30
    connection = None
    while time.monotonic() < deadline:
        details = api("GET", path)
        held = details.get("consumer_details") or []
        if details.get("policy") == policy and held:
            connection = held[0]["channel_details"]["connection_name"]
            break
        await asyncio.sleep(0.5)
    assert connection is not None, "the management API never showed the policy and consumer"
    api("DELETE", f"connections/{quote(connection, safe='')}")

    deadline = time.monotonic() + 30
    with pytest.raises(TransportError) as refused:
        while time.monotonic() < deadline:
            try:
                await first_receive(source)
            except TransportError as exc:
                if exc.retriable:
                    continue
                raise
    assert f"set by policy {policy!r} (delivery-limit 3)" in str(refused.value)


@pytest.mark.parametrize(
    ("management_url", "said", "retriable"),
    [
        ("http://127.0.0.1:{port}/", "could not be used", True),
        ("http://guest:wrong@127.0.0.1:15672/", "refused the request", False),
    ],
    ids=["unreachable", "credentials-refused"],
)
async def test_a_management_api_that_cannot_be_used_refuses_quorum_sources(
    make: Make,
    rabbitmq_queues: Callable[..., str],
    channel: Any,
    management_url: str,
    said: str,
    retriable: bool,
) -> None:
    """BV:48-51 and 148-151: without the management API the limit cannot be known, and
    NServiceBus does not start; the error says what to do. One that does not answer may be a
    restarting broker, so the route retries (tests/integration/test_rabbitmq_restart.py)."""
    queue = rabbitmq_queues("Unchecked")
    declare(channel, queue, **{"x-queue-type": "quorum"})
    url = management_url.format(port=closed_port())

    with pytest.raises(TransportError) as refused:
        await first_receive(make(management_url=url).source(queue))
    text = str(refused.value)
    assert f"cannot check the delivery limit of quorum queue {queue!r}" in text
    assert f"the RabbitMQ management API at {url.replace('guest:wrong@', '')} {said}" in text
    assert "rabbitmq-plugins enable rabbitmq_management" in text
    assert "validate_delivery_limits: false" in text
    assert "wrong" not in text  # the password never reaches a message
    assert refused.value.retriable is retriable
    assert isinstance(refused.value, AccessRefused) is (said == "refused the request")


async def test_unchecked_a_limited_quorum_queue_drops_what_the_bridge_returns_to_it(
    make: Make,
    rabbitmq_queues: Callable[..., str],
    channel: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Why the check exists: with it switched off (as ValidateDeliveryLimits = false, BV:119-123,
    with a warning), each failed send returns the batch, and the broker drops the message once
    it was returned more often than the queue's limit."""
    queue = rabbitmq_queues("Dropping")
    declare(channel, queue, **{"x-queue-type": "quorum", "x-delivery-limit": 2})
    publish(channel, queue)
    source = make(validate_delivery_limits=False, management_url="http://127.0.0.1:1/").source(
        queue
    )

    with caplog.at_level(logging.WARNING, "bridge.rabbitmq"):
        returned = 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and await first_receive(source) == 1:
            returned += 1  # received, then returned as a failed send returns it
    assert returned == 3  # delivered once plus twice more (x-delivery-limit 2), then dropped
    assert depth(queue, channel) == 0
    assert f"the delivery limit of queue {queue!r} is not checked" in caplog.text


async def install_local(config: Any) -> None:
    local = load("local", config)
    try:
        await local.install(["Orders"])
    finally:
        await local.close()


def test_install_and_run_refuse_a_limited_quorum_source(
    tmp_path: Path, rabbitmq_url: str, rabbitmq_queues: Callable[..., str], channel: Any
) -> None:
    """`bridge install` (BV is also the CLI's `queue validate-delivery-limit`) and a route's
    start (MessagePump.cs:97) refuse the queue; the messages stay in it."""
    queue = rabbitmq_queues("Orders")
    declare(channel, queue, **{"x-queue-type": "quorum", "x-delivery-limit": 5})
    publish(channel, queue, 2)
    routes = tmp_path / "routes.yaml"
    routes.write_text(
        textwrap.dedent(
            f"""\
            connections:
              rabbit: {{type: rabbitmq, url: "{rabbitmq_url}", topology: direct}}
              local: {{type: sqlite, path: "{tmp_path / "bridge.db"}"}}
            routes:
              - name: orders
                from: {{connection: rabbit, queue: "{queue}"}}
                to: {{connection: local, queue: Orders}}
                error_queue: "{rabbitmq_queues("OrdersErr")}"
            """
        )
    )
    reason = f"quorum queue {queue!r} has a delivery limit of 5, set by its x-delivery-limit"

    def bridge(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "bridge", *args, "-c", str(routes)]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    install = bridge("install")
    assert install.returncode == 1
    assert f"\nbridge install: rabbitmq connection 'rabbit': {reason}" in install.stderr

    printed = bridge("install", "--print-sql")
    assert printed.returncode == 0
    assert f"""'{{"pattern":"^{queue}$","apply-to":"quorum_queues",""" in printed.stdout
    assert f"/api/policies/%2F/nsb.{queue}.delivery-limit\n" in printed.stdout

    # Install stopped at the refused queue; the destination table is made here.
    asyncio.run(install_local(load_config(routes).config.connections["local"]))
    run = bridge("run", "--until-idle", "3600")
    assert run.returncode == 1
    assert f"route orders failed: rabbitmq connection 'rabbit': {reason}" in run.stderr
    assert depth(queue, channel) == 2
