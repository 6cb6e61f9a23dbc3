"""`bridge send` as users call it: what it refuses, what the messages carry, and Ctrl-C."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest

from bridge.config.loader import load_config
from bridge.envelope import Envelope
from bridge.transports import load
from tests.integration.test_cli import bridge
from tests.support.queues import drain

pytestmark = pytest.mark.integration


@pytest.fixture
def routes(tmp_path: Path) -> Path:
    path = tmp_path / "routes.yaml"
    path.write_text(
        f'connections:\n  local: {{type: sqlite, path: "{tmp_path / "queues.db"}"}}\n'
        "routes:\n  - {name: r, from: {connection: local, queue: Sales}, "
        "to: {connection: local, queue: Done}}\n"
    )
    assert bridge("install", "-c", str(path)).returncode == 0
    return path


def take(routes: Path, queue: str) -> list[Envelope]:
    async def run() -> list[Envelope]:
        transport = load("local", load_config(routes).config.connections["local"])
        try:
            return await drain(transport, queue)
        finally:
            await transport.close()

    return asyncio.run(run())


def rows(database: Path, table: str) -> int:
    """Rows in a SQLite queue table, read while a send writes (0 before it exists)."""
    with sqlite3.connect(database, timeout=30) as conn:
        try:
            return int(conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])
        except sqlite3.OperationalError:  # not created yet
            return 0


@pytest.mark.parametrize(
    "ttl",
    ["-00:00:01", "00:00:00", "24.20:31:23.648", "10675199.02:48:05.4775808", "00:00:00.0005"],
)
def test_a_ttl_out_of_range_is_a_usage_error_that_says_the_range(routes: Path, ttl: str) -> None:
    result = bridge("send", "local", "Sales", f"--ttl={ttl}", "-c", str(routes))
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        "bridge send: error: --ttl takes a time span from 00:00:00.001 to 24.20:31:23.647, in "
        "whole milliseconds (the most SQL Server carries: an Int32 of milliseconds; RabbitMQ "
        f"carries whole milliseconds), got {ttl!r}\n"
    )
    assert rows(routes.parent / "queues.db", "Sales") == 0


def test_one_message_id_for_many_messages_is_refused(routes: Path) -> None:
    fixed = ("--header", "NServiceBus.MessageId=order-1")
    refused = bridge("send", "local", "Sales", *fixed, "--count", "2", "-c", str(routes))
    assert refused.returncode == 2
    assert "--header NServiceBus.MessageId with --count 2 would send 2 messages with one id" in (
        refused.stderr
    )
    assert rows(routes.parent / "queues.db", "Sales") == 0

    one = bridge("send", "local", "Sales", *fixed, "-c", str(routes))
    assert one.returncode == 0, one.stderr
    (message,) = take(routes, "Sales")
    assert message.message_id == "order-1"
    assert message.headers.get("NServiceBus.CorrelationId") == "order-1"


def test_the_content_type_is_the_bodys_unless_a_header_says(routes: Path) -> None:
    for body, extra in [
        ("plain words", ()),
        ('{"id": 1}', ()),
        ("<Order/>", ()),
        ("plain words", ("--header", "NServiceBus.ContentType=application/vnd.shop")),
    ]:
        sent = bridge("send", "local", "Sales", "--body", body, *extra, "-c", str(routes))
        assert sent.returncode == 0, sent.stderr
    types = [m.headers.get_all("NServiceBus.ContentType") for m in take(routes, "Sales")]
    assert types == [["text/plain"], ["application/json"], ["text/xml"], ["application/vnd.shop"]]


def test_ctrl_c_stops_after_whole_chunks_and_says_how_many(routes: Path) -> None:
    """SIGINT while a large send runs: the chunk in hand is sent durably, nothing after it;
    the count printed is what the queue holds; exit 130."""
    database = routes.parent / "queues.db"
    command = [sys.executable, "-m", "bridge", "send", "local", "Sales", "-c", str(routes)]
    process = subprocess.Popen(
        [*command, "--count", "1000000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while rows(database, "Sales") == 0 and process.poll() is None:
            assert time.monotonic() < deadline, "nothing was sent"
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    held = rows(database, "Sales")
    assert process.returncode == 130, err
    assert out == f"interrupted: sent {held} of 1000000 messages to local/Sales\n", err
    assert 0 < held < 1_000_000 and held % 1000 == 0  # whole chunks (SEND_CHUNK)
    assert "Traceback" not in err


def test_bridge_send_ttl_arrives_on_rabbitmq_as_given_up_to_the_most_sql_server_carries(
    tmp_path: Path, rabbitmq_url: str, rabbitmq_queues: Callable[[str], str]
) -> None:
    """The largest --ttl is one RabbitMQ takes too (its broker refuses an `expiration` past
    2^32 - 1 ms with 406), and arrives as given."""
    queue = rabbitmq_queues("ttl")
    routes = tmp_path / "routes.yaml"
    routes.write_text(
        f'connections:\n  rabbit: {{type: rabbitmq, url: "{rabbitmq_url}", topology: direct}}\n'
        "routes: []\n"
    )
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    channel: Any = connection.channel()
    try:
        channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        sent = bridge("send", "rabbit", queue, "--ttl", "24.20:31:23.647", "-c", str(routes))
        assert sent.returncode == 0, sent.stderr
        _, properties, _ = channel.basic_get(queue, auto_ack=True)
        assert properties.expiration == "2147483647"
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--delay", "00:00:00"], "--delay takes a time span greater than zero"),
        (["--delay", "5s"], "--delay takes a time span greater than zero"),
        (["--deliver-at", "2026-11-26T10:00:00"], "--deliver-at takes an ISO 8601 time with"),
        (["--delay", "00:00:05", "--ttl", "00:01:00"], "NServiceBus refuses postponed delivery"),
        (
            ["--delay", "30000.00:00:00"],
            "longer than the 2147483647 s (24855 days, 3:14:07) a sqlite connection holds",
        ),
    ],
)
def test_a_delay_the_destination_cannot_carry_out_is_refused(
    routes: Path, args: list[str], said: str
) -> None:
    result = bridge("send", "local", "Sales", *args, "-c", str(routes))
    assert result.returncode == 2, result.stderr
    assert said in result.stderr
    assert take(routes, "Sales") == []


def test_a_delay_beyond_rabbitmqs_28_bits_of_seconds_is_refused(
    tmp_path: Path, rabbitmq_url: str
) -> None:
    """DelayInfrastructure.cs:12-15 of NServiceBus.RabbitMQ: at most 2^28-1 s (8.5 years)."""
    routes = tmp_path / "routes.yaml"
    routes.write_text(
        f'connections:\n  rabbit: {{type: rabbitmq, url: "{rabbitmq_url}"}}\nroutes: []\n'
    )
    result = bridge("send", "rabbit", "Nowhere", "--delay", "3200.00:00:00", "-c", str(routes))
    assert result.returncode == 2, result.stderr
    assert "longer than the 268435455 s (3106 days, 21:24:15) a rabbitmq connection holds" in (
        result.stderr
    )


def test_bridge_send_delay_arrives_on_rabbitmq_when_due(
    tmp_path: Path, rabbitmq_url: str, rabbitmq_queues: Callable[[str], str]
) -> None:
    queue = rabbitmq_queues("delayed")
    routes = tmp_path / "routes.yaml"
    routes.write_text(
        f'connections:\n  rabbit: {{type: rabbitmq, url: "{rabbitmq_url}", topology: direct}}\n'
        "routes: []\n"
    )
    declaring = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    declaring.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    declaring.close()
    started = time.time()
    sent = bridge("send", "rabbit", queue, "--delay", "00:00:02", "-c", str(routes))
    assert sent.returncode == 0, sent.stderr
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    channel: Any = connection.channel()
    try:
        arrived = None
        while arrived is None and time.time() < started + 15:
            method, _, _ = channel.basic_get(queue, auto_ack=True)
            if method is not None:
                arrived = time.time()
            else:
                time.sleep(0.05)
        assert arrived is not None, "never arrived"
        assert arrived - started >= 2
    finally:
        connection.close()
