"""`bridge peek` on RabbitMQ tells the oldest waiting message's age, from its
`NServiceBus.TimeSent`, by taking the message and giving it straight back: the queue keeps
every message in its order, and a quorum queue whose broker would count that as a delivery
is not looked at (RabbitMQ before 4.3, bridge/transports/rabbitmq/transport.py
`NACK_UNCOUNTED`)."""

from __future__ import annotations

import json
import subprocess
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest

from bridge.transports.rabbitmq.delivery_limit import broker_version
from bridge.transports.rabbitmq.transport import NACK_UNCOUNTED
from tests.support.cli import run_bridge

pytestmark = pytest.mark.integration


def bridge(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bridge(*args, timeout=60)


def routes(tmp_path: Path, url: str, queue_type: str, queues: Callable[..., str]) -> Path:
    """A route from a fresh queue (`queues` names it and the others, for cleaning up)."""
    queue, out, error = queues("Peeked"), queues("PeekedOut"), queues("PeekedError")
    path = tmp_path / "routes.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            connections:
              rabbit: {{type: rabbitmq, url: "{url}", queue_type: {queue_type},
                        validate_delivery_limits: false}}
            routes:
              - {{name: peeked, from: {{connection: rabbit, queue: {queue}}},
                  to: {{connection: rabbit, queue: {out}}}, error_queue: {error}}}
            """
        )
    )
    return path


def source(config: Path) -> str:
    from bridge.config.loader import load_config

    return load_config(config).config.routes[0].from_.address


def take_all(url: str, queue: str) -> list[tuple[str, bool, Any]]:
    """Every message of `queue`, acknowledged: (its Seq header, redelivered, x-delivery-count)."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    taken = []
    while True:
        method, properties, _ = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        headers = properties.headers or {}
        seq = headers["Seq"].decode() if isinstance(headers["Seq"], bytes) else headers["Seq"]
        taken.append((seq, method.redelivered, headers.get("x-delivery-count")))
    connection.close()
    return taken


def version_of(url: str) -> tuple[int, int]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    version = connection._impl.server_properties["version"]
    connection.close()
    return broker_version(version.decode() if isinstance(version, bytes) else version)


def peek(config: Path, queue: str) -> tuple[dict[str, Any], str]:
    result = bridge("peek", "rabbit", queue, "--json", "-c", str(config))
    return json.loads(result.stdout), result.stderr


def send_three(config: Path, queue: str) -> None:
    for seq in ("1", "2", "3"):
        bridge("send", "rabbit", queue, "--header", f"Seq={seq}", "-c", str(config))


def test_a_classic_queue_tells_its_oldest_age_and_keeps_every_message_in_order(
    tmp_path: Path, rabbitmq_url: str, rabbitmq_queues: Callable[..., str]
) -> None:
    config = routes(tmp_path, rabbitmq_url, "classic", rabbitmq_queues)
    queue = source(config)
    bridge("install", "-c", str(config))
    assert peek(config, queue)[0]["oldest_age_seconds"] is None  # nothing waits
    send_three(config, queue)
    time.sleep(1.2)
    stats, _ = peek(config, queue)
    assert stats["depth"] == 3
    assert 1.0 <= stats["oldest_age_seconds"] < 60
    # The delay levels' messages, every destination's together (others' tests may have some).
    assert isinstance(stats["delayed_all_destinations"], int)
    assert stats["delayed_all_destinations"] >= 0
    again, _ = peek(config, queue)
    assert again["depth"] == 3 and again["oldest_age_seconds"] >= stats["oldest_age_seconds"]
    # the first message went back to its place, marked redelivered; nothing else changed
    taken = take_all(rabbitmq_url, queue)
    assert taken == [("1", True, None), ("2", False, None), ("3", False, None)]


def test_a_quorum_queue_is_looked_at_only_where_giving_back_is_not_a_delivery(
    tmp_path: Path, rabbitmq_url: str, rabbitmq_queues: Callable[..., str]
) -> None:
    config = routes(tmp_path, rabbitmq_url, "quorum", rabbitmq_queues)
    queue = source(config)
    bridge("install", "-c", str(config))
    send_three(config, queue)
    stats, log = peek(config, queue)
    assert stats["depth"] == 3
    major, minor = version_of(rabbitmq_url)
    taken = take_all(rabbitmq_url, queue)
    if (major, minor) < NACK_UNCOUNTED:
        assert stats["oldest_age_seconds"] is None
        assert (
            f"the age of the oldest message in {queue!r} is not read: it is a quorum queue, and "
            f"RabbitMQ {major}.{minor} would count giving the message back as a delivery"
        ) in log
        assert [(seq, redelivered) for seq, redelivered, _ in taken] == [
            ("1", False),
            ("2", False),
            ("3", False),
        ]
        assert not any(count for _, _, count in taken)  # never given back: counted nothing
    else:
        assert 0 <= stats["oldest_age_seconds"] < 60
        assert [seq for seq, _, _ in taken] == ["1", "2", "3"]
        assert not any(count for _, _, count in taken)  # basic.nack counted nothing
