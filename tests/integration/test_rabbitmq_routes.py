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
import time
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
from tests.support.queues import drain

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
        self.connections: list[Any] = []
        self.extra_queues: list[str] = []  # declared by a test: deleted with the setup

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

    def start(self, *args: str) -> tuple[subprocess.Popen[str], Path]:
        """A `bridge` process left running; its stderr goes to the returned file."""
        log = self.config.with_name(f"bridge-{unique('log')}.err")
        with log.open("w") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "bridge", *args, "-c", str(self.config)],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                text=True,
            )
        return process, log

    def channel(self) -> Any:
        """A plain pika channel; its connection is closed with the setup."""
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        self.connections.append(connection)
        return connection.channel()

    async def drain(self, queue: str) -> list[Envelope]:
        return await drain(self.db, queue)

    async def close(self) -> None:
        await self.db.close()
        channel = self.channel()
        for name in (self.queue, self.rabbit_errors, *self.extra_queues):
            channel.queue_delete(name)
            channel.exchange_delete(name)
        for connection in self.connections:
            if connection.is_open:
                connection.close()


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


async def test_check_and_print_only_install(setup: Setup) -> None:
    out = await asyncio.to_thread(setup.run, "check", "--connect")
    assert "rabbit: OK" in out
    printed = await asyncio.to_thread(setup.run, "install", "--print-sql")
    assert f"/api/queues/%2F/{setup.queue}\n" in printed
    assert f"/api/exchanges/%2F/{setup.rabbit_errors}\n" in printed


async def wait_for_log(process: subprocess.Popen[str], log: Path, text: str, times: int) -> None:
    """Wait until the running bridge wrote `text` `times` times to its stderr."""
    deadline = time.monotonic() + 60
    while (seen := (written := await asyncio.to_thread(log.read_text)).count(text)) < times:
        assert process.poll() is None, written
        assert time.monotonic() < deadline, f"{text!r} seen {seen} times:\n{written}"
        await asyncio.sleep(0.05)


async def test_a_poison_message_the_error_queue_refuses_waits_at_the_source(
    setup: Setup,
) -> None:
    """The broker nacks the error-queue copy (a full queue that rejects publishes): the route
    retries and later batches go on arriving, yet the poison message is never acknowledged with
    them; once the error queue takes copies, it is there."""
    channel = setup.channel()
    errors = setup.rabbit_errors
    channel.queue_delete(errors)
    refusing = {"x-queue-type": "classic", "x-max-length": 0, "x-overflow": "reject-publish"}
    channel.queue_declare(errors, durable=True, arguments=refusing)
    channel.queue_bind(errors, errors, "")
    accepting = unique("RabbitErrLater")
    setup.extra_queues.append(accepting)
    channel.confirm_delivery()
    channel.basic_publish(setup.queue, "", b"no id", pika.BasicProperties())
    for i in range(3):
        channel.basic_publish(setup.queue, "", b"ok", pika.BasicProperties(message_id=f"ok-{i}"))
    process, log = setup.start("run", "--route", "from-rabbit", "--until-idle", "1")
    try:
        await wait_for_log(process, log, "refused 1 error-queue copies", 1)
        for i in range(3, 6):  # later batches, which must not acknowledge the poison message
            channel.basic_publish(
                setup.queue, "", b"ok", pika.BasicProperties(message_id=f"ok-{i}")
            )
        await wait_for_log(process, log, "refused 1 error-queue copies", 2)
        # Copies go to a queue that takes them, with no moment where the exchange has none.
        channel.queue_declare(accepting, durable=True, arguments={"x-queue-type": "quorum"})
        channel.queue_bind(accepting, errors, "")
        channel.queue_delete(errors)
        assert await asyncio.to_thread(process.wait, 120) == 0, log.read_text()
        assert "Traceback" not in log.read_text()
        _, properties, body = channel.basic_get(accepting, auto_ack=True)
        assert body == b"no id"
        assert properties.headers["NServiceBus.FailedQ"] == setup.queue
        assert channel.queue_declare(accepting, passive=True).method.message_count == 0
        assert channel.queue_declare(setup.queue, passive=True).method.message_count == 0
        ids = {e.message_id for e in await setup.drain(setup.inbox)}  # retried batches repeat
        assert ids == {f"ok-{i}" for i in range(6)}
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def row(i: int, **extra: str) -> Envelope:
    return Envelope(Headers([("NServiceBus.MessageId", f"m-{i}"), *extra.items()]), b"%d" % i)


def rabbit_ids(channel: Any, queue: str) -> list[str]:
    """Take every message of `queue`: their message ids in queue order."""
    ids = []
    while True:
        method, properties, _ = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return ids
        ids.append(properties.message_id)


async def test_unroutable_rows_go_to_the_sql_error_queue_and_the_route_goes_on(
    setup: Setup,
) -> None:
    channel = setup.channel()
    channel.queue_unbind(setup.queue, setup.queue, "")  # the exchange routes to no queue
    sink = setup.db.sink(setup.outbox)
    await sink.send([row(i) for i in range(100)])
    await asyncio.to_thread(setup.run, "run", "--route", "to-rabbit", "--until-idle", "1")
    dead = await setup.drain(setup.sql_errors)
    assert [e.message_id for e in dead] == [f"m-{i}" for i in range(100)]
    for i, copy in enumerate(dead):
        headers = copy.headers
        assert copy.body == b"%d" % i
        assert headers.get("NServiceBus.FailedQ") == f'"main"."{setup.outbox}"'
        assert headers.get("NServiceBus.ExceptionInfo.ExceptionType") == (
            "bridge.errors.MessageRejected"
        )
        message = headers.get("NServiceBus.ExceptionInfo.Message") or ""
        assert f"message {i % 64} (m-{i}) is unroutable" in message
        assert f"exchange {setup.queue!r}" in message
        assert (headers.get("NServiceBus.TimeOfFailure") or "").endswith(" Z")
    assert (await setup.db.peek(setup.outbox)).depth == 0
    channel.queue_bind(setup.queue, setup.queue, "")
    await sink.send([row(i) for i in range(100, 110)])
    await sink.close()
    await asyncio.to_thread(setup.run, "run", "--route", "to-rabbit", "--until-idle", "1")
    assert rabbit_ids(channel, setup.queue) == [f"m-{i}" for i in range(100, 110)]
    assert not await setup.drain(setup.sql_errors)


async def test_a_partly_unroutable_batch_delivers_the_rest_once(setup: Setup) -> None:
    """Behind a headers exchange only rows with route=yes have a queue: every other row of a
    batch comes back unroutable and goes to the error queue, named in its own copy; the rows the
    broker confirmed are not sent again."""
    channel = setup.channel()
    channel.exchange_delete(setup.queue)
    channel.exchange_declare(setup.queue, exchange_type="headers", durable=True)
    channel.queue_bind(setup.queue, setup.queue, arguments={"x-match": "all", "route": "yes"})
    sink = setup.db.sink(setup.outbox)
    await sink.send([row(i, route="yes" if i % 2 else "no") for i in range(150)])
    await sink.close()
    await asyncio.to_thread(setup.run, "run", "--route", "to-rabbit", "--until-idle", "1")
    assert rabbit_ids(channel, setup.queue) == [f"m-{i}" for i in range(1, 150, 2)]
    dead = await setup.drain(setup.sql_errors)
    assert [e.message_id for e in dead] == [f"m-{i}" for i in range(0, 150, 2)]
    for copy in dead:
        message = copy.headers.get("NServiceBus.ExceptionInfo.Message") or ""
        assert f"({copy.message_id}) is unroutable" in message
