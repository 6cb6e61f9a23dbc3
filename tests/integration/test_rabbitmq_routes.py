"""SQLite -> RabbitMQ -> SQLite through real `bridge install/run/peek/check` processes.

RabbitMQ is also written and read with a plain pika channel here, so the bridge is checked
against something it did not write.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pika
import pytest

from bridge.config.loader import load_config
from bridge.envelope import Envelope, Headers
from bridge.protocols import Transport
from bridge.transports import load
from tests.conftest import unique

pytestmark = pytest.mark.integration


class Setup:
    def __init__(self, tmp_path: Path, rabbitmq_url: str) -> None:
        self.url = rabbitmq_url
        self.outbox, self.inbox, self.sql_errors = unique("Out"), unique("In"), unique("SqlErr")
        self.queue, self.rabbit_errors = unique("Sales"), unique("RabbitErr")
        self.config = tmp_path / "routes.yaml"
        self.config.write_text(
            textwrap.dedent(
                f"""\
                connections:
                  db: {{type: sqlite, path: "{tmp_path / "queues.db"}"}}
                  rabbit: {{type: rabbitmq, url: "{rabbitmq_url}", queue_type: quorum}}
                routes:
                  - name: to-rabbit
                    from: {{connection: db, queue: "{self.outbox}"}}
                    to: {{connection: rabbit, queue: "{self.queue}"}}
                    error_queue: "{self.sql_errors}"
                    batch_size: 64
                  - name: from-rabbit
                    from: {{connection: rabbit, queue: "{self.queue}"}}
                    to: {{connection: db, queue: "{self.inbox}"}}
                    error_queue: "{self.rabbit_errors}"
                    batch_size: 64
                """
            )
        )
        self.db: Transport = load("db", load_config(self.config).config.connections["db"])

    def run(self, *args: str, timeout: float = 120) -> str:
        process = subprocess.run(
            [sys.executable, "-m", "bridge", *args, "-c", str(self.config)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert process.returncode == 0, process.stderr
        assert "Traceback" not in process.stderr
        return process.stdout

    def channel(self) -> Any:
        return pika.BlockingConnection(pika.URLParameters(self.url)).channel()

    async def drain(self, queue: str) -> list[Envelope]:
        source = self.db.source(queue)
        got: list[Envelope] = []
        try:
            while True:
                batch = await source.receive_batch(500, 0.2)
                async with batch:
                    got.extend(batch.messages)
                    await batch.commit()
                if not batch.messages:
                    return got
        finally:
            await source.close()

    async def close(self) -> None:
        await self.db.close()
        channel = self.channel()
        for name in (self.queue, self.rabbit_errors):
            channel.queue_delete(name)
            channel.exchange_delete(name)
        channel.connection.close()


@pytest.fixture
async def setup(tmp_path: Path, rabbitmq_url: str) -> AsyncIterator[Setup]:
    s = Setup(tmp_path, rabbitmq_url)
    s.run("install")
    yield s
    await s.close()


async def test_sql_to_rabbitmq_to_sql_keeps_every_header_and_byte(setup: Setup) -> None:
    sent = [
        Envelope(
            Headers(
                [
                    ("NServiceBus.MessageId", f"m-{i}"),
                    ("NServiceBus.ReplyToAddress", "Sales@[dbo]@[nservicebus]"),
                    ("NServiceBus.EnclosedMessageTypes", "Ns.OrderPlaced, Sales"),
                    ("seq", str(i)),
                    ("null", None),
                    ("empty", ""),
                    ("slash", "a/b"),
                ]
            ),
            bytes([i % 256]) * (i % 300),
        )
        for i in range(300)
    ]
    sink = setup.db.sink(setup.outbox)
    await sink.send(sent)
    await sink.close()
    await asyncio.to_thread(setup.run, "run", "--until-idle", "2")
    back = await setup.drain(setup.inbox)
    assert [e.message_id for e in back] == [e.message_id for e in sent]  # one queue: FIFO
    for original, copy in zip(sent, back, strict=True):
        assert copy.body == original.body
        assert copy.headers.items() == original.headers.items()
    peek = json.loads(await asyncio.to_thread(setup.run, "peek", "rabbit", setup.queue, "--json"))
    assert peek["depth"] == 0


async def test_a_message_an_endpoint_cannot_read_goes_to_the_error_queue(setup: Setup) -> None:
    channel = setup.channel()
    channel.confirm_delivery()
    channel.basic_publish(setup.queue, "", b"no id", pika.BasicProperties(headers={"a": "b"}))
    channel.basic_publish(setup.queue, "", b"ok", pika.BasicProperties(message_id="native-1"))
    await asyncio.to_thread(setup.run, "run", "--route", "from-rabbit", "--until-idle", "2")
    assert [e.message_id for e in await setup.drain(setup.inbox)] == ["native-1"]
    _, properties, body = channel.basic_get(setup.rabbit_errors, auto_ack=True)
    assert body == b"no id"
    assert properties.headers["a"] == "b"
    assert properties.headers["NServiceBus.FailedQ"] == setup.queue
    channel.connection.close()


async def test_check_and_print_only_install(setup: Setup) -> None:
    out = await asyncio.to_thread(setup.run, "check", "--connect")
    assert "rabbit: OK" in out
    printed = await asyncio.to_thread(setup.run, "install", "--print-sql")
    assert f"queue.declare queue={setup.queue!r} durable=true" in printed
    assert f"exchange.declare exchange={setup.rabbit_errors!r} type=fanout" in printed
