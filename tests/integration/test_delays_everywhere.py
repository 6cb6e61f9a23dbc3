"""A 5 s delay to each kind of destination, through real services and a real `bridge run`:
`bridge send --deliver-at` (at least 5 s on) to a PostgreSQL and a SQLite queue table
(NServiceBus's delayed table, moved by the bridge's mover), an NGinn table (an `R` row,
moved by the bridge with `nginn.retries`), a RabbitMQ queue (NServiceBus's delay
infrastructure) and a Kafka topic (the `delays:` connection's `BridgeDelays`, produced by the
bridge when due). Each arrives after its due time and not much later, also when the bridge is
killed with kill -9 while they wait and started again. The lateness of each is printed
(pytest -s).

Facts: NServiceBus.SqlServer Sql.Shared/DelayedDelivery/StoreDelayedMessageCommand.cs:18 (the
ForwardDestination header), DueDelayedMessageProcessor.cs:54-101 and DelayedMessageTable.cs:
47-77 (a mover moves due rows in batches, then waits for the next due time).
"""

from __future__ import annotations

import asyncio
import subprocess
import textwrap
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import pika
import pytest
from aiokafka import AIOKafkaConsumer

from bridge.commands import send as send_command
from bridge.config.loader import load_config
from bridge.protocols import Transport
from bridge.transports import load
from tests.conftest import unique
from tests.faults import BridgeProcess
from tests.support.cli import run_bridge
from tests.support.queues import drain

pytestmark = pytest.mark.integration

DELAY = 5.0
SENDING = 1.5  # seconds the five sends take at most


def bridge(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_bridge(*args, config=config, check=False, timeout=120)


def write_config(
    tmp_path: Path, kafka: str, rabbit: str, dsn: str, schema: str, rabbit_queue: str
) -> Path:
    config = tmp_path / "routes.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            connections:
              pg: {{type: postgresql, dsn: "{dsn}", schema: {schema}}}
              lite: {{type: sqlite, path: "{tmp_path / "lite.db"}"}}
              ng: {{type: sqlite, path: "{tmp_path / "ng.db"}", layout: nginn,
                    nginn: {{alias: ng, timezone: Europe/Warsaw, retries: true,
                           types: {{Sales.OrderPlaced: "Sales.OrderPlaced, Sales"}}}}}}
              rabbit: {{type: rabbitmq, url: "{rabbit}", topology: direct}}
              kafka: {{type: kafka, bootstrap_servers: "{kafka}", idempotence: false,
                       partitions: 1}}
            delays: {{connection: lite}}
            routes:
              - name: pg
                from: {{connection: pg, queue: In}}
                to: {{connection: pg, queue: Out}}
              - name: lite
                from: {{connection: lite, queue: In}}
                to: {{connection: lite, queue: Out}}
              - name: ng
                from: {{connection: ng, queue: In}}
                to: {{connection: ng, queue: Out}}
              - name: rabbit
                from: {{connection: lite, queue: ToRabbit}}
                to: {{connection: rabbit, queue: "{rabbit_queue}"}}
            """
        )
    )
    return config


async def arrived_in(transport: Transport, queue: str) -> list[str]:
    return [e.message_id or "" for e in await drain(transport, queue)]


def rabbit_arrived(url: str, queue: str) -> list[str]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        method, properties, _ = connection.channel().basic_get(queue, auto_ack=True)
        return [] if method is None else [properties.message_id]
    finally:
        connection.close()


@pytest.mark.parametrize("kill", [False, True], ids=["running", "killed-while-waiting"])
async def test_a_5s_delay_to_every_kind_of_destination_arrives_after_5s_and_soon_after(
    tmp_path: Path,
    kafka_bootstrap: str,
    rabbitmq_url: str,
    rabbitmq_queues: Callable[[str], str],
    pg_dsn: str,
    pg_schema: str,
    kill: bool,
) -> None:
    topic, rabbit_queue = unique("delayed"), rabbitmq_queues("Delayed")
    config = write_config(tmp_path, kafka_bootstrap, rabbitmq_url, pg_dsn, pg_schema, rabbit_queue)
    installed = await asyncio.to_thread(bridge, config, "install")
    assert installed.returncode == 0, installed.stderr
    loaded = load_config(config).config
    transports = {name: load(name, loaded.connections[name]) for name in ("pg", "lite", "ng")}
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest"
    )
    ends = {"pg": "Out", "lite": "Out", "ng": "Out", "rabbit": rabbit_queue, "kafka": topic}
    process = BridgeProcess(config, "run")
    try:
        process.start()
        # `bridge send` in this process (a second or so faster each), all due at one moment;
        # each has been stored at least DELAY before it (asserted below).
        due = time.time() + SENDING + DELAY
        at = datetime.fromtimestamp(due, UTC).isoformat()
        for connection, queue in ends.items():
            await send_command(
                str(config),
                connection,
                queue,
                headers=[
                    f"NServiceBus.MessageId={connection}-delayed",
                    "NServiceBus.EnclosedMessageTypes=Sales.OrderPlaced",
                ],
                body="{}",
                ttl=None,
                count=1,
                deliver_at=at,
            )
        assert time.time() <= due - DELAY, "sending took too long to measure a 5 s delay"
        await consumer.start()
        if kill:  # while every message waits (about 3 s before the first is due)
            process.kill()
            process.start()

        async def kafka_arrived() -> list[str]:
            fetched = await consumer.getmany(timeout_ms=50)
            return [
                dict(r.headers)["NServiceBus.MessageId"].decode()
                for records in fetched.values()
                for r in records
            ]

        polls: dict[str, Callable[[], Awaitable[list[str]]]] = {
            name: (lambda name=name: arrived_in(transports[name], "Out"))
            for name in ("pg", "lite", "ng")
        }
        polls["rabbit"] = lambda: asyncio.to_thread(rabbit_arrived, rabbitmq_url, rabbit_queue)
        polls["kafka"] = kafka_arrived
        arrived: dict[str, float] = {}
        got: dict[str, list[str]] = {}
        deadline = due + 15

        async def watch(name: str, poll: Callable[[], Awaitable[list[str]]]) -> None:
            while time.time() < deadline:
                ids = await poll()
                if ids:
                    got[name] = ids
                    arrived[name] = time.time()
                    return
                await asyncio.sleep(0.05)

        await asyncio.gather(*(watch(name, poll) for name, poll in polls.items()))
        await asyncio.sleep(1.5)  # and nothing twice
        for name, poll in polls.items():
            got.setdefault(name, []).extend(await poll())
    finally:
        process.kill()
        await consumer.stop()
        for transport in transports.values():
            await transport.close()
    assert got == {name: [f"{name}-delayed"] for name in ends}, process.output()
    lateness = {name: arrived[name] - due for name in ends}
    print(f"\nlateness ({'killed' if kill else 'running'}):", end="")
    for name, late in lateness.items():
        print(f" {name} {late:+.2f} s", end="")
    for name, late in lateness.items():
        assert late >= 0, f"{name} arrived {-late:.2f} s early"
        assert late < 3.0, f"{name} arrived {late:.2f} s late"
