"""One small variant per transport: how to build it, and where it legitimately differs.

Every transport is built through the public name table (`bridge.transports.load`) from a
connection validated by `BridgeConfig`, as routes.yaml builds it; only the in-memory transport
is built directly. What a transport does differently is data here (a flag or an expected
report), never a skip in a test.
"""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge.config.models import BridgeConfig
from bridge.protocols import Transport
from bridge.transports import load
from bridge.transports.memory import Broker
from bridge.transports.memory import Transport as Memory
from tests.support.localkafka import free_port

#: Headers a poison message carries, as text no transport can read (SQL) or as bytes that are
#: not UTF-8 (Kafka, RabbitMQ).
UNREADABLE = "not json"

Lines = Callable[[str], list[str]]


def connection(name: str, settings: dict[str, Any]) -> Any:
    """The connection model routes.yaml would give `settings`."""
    config = BridgeConfig.model_validate({"connections": {name: settings}, "routes": []})
    return config.connections[name]


def build(name: str, settings: dict[str, Any]) -> Transport:
    return load(name, connection(name, settings))


@dataclass
class World:
    """Where one test's transport lives: the services' coordinates and its scratch directory."""

    tmp_path: Path
    sqlite_path: str = ""
    pg_dsn: str = ""
    pg_schema: str = ""
    kafka_bootstrap: str = ""
    rabbitmq_url: str = ""


@dataclass(frozen=True)
class Variant:
    name: str
    #: The fixtures of tests/conftest.py this variant needs (they fail when a service is away).
    needs: tuple[str, ...]
    make: Callable[[World], Transport]
    #: A transport pointed at a closed port or an unusable path (None: nothing to reach).
    offline: Callable[[World], Transport] | None
    #: Writes one message whose headers cannot be read, as a broken producer would.
    put_poison: Callable[[World, Transport, str, bytes], Coroutine[Any, Any, None]]
    #: A source reads in a consumer group (Kafka): sources of one address share it.
    groups: bool = False
    #: A header name may occur more than once (SQL's JSON object keeps the last occurrence).
    duplicate_headers: bool = True
    #: Received envelopes carry the transport's own distinct `native_id`.
    native_ids: bool = True
    #: `check` of an address that does not exist raises a non-retriable TransportError naming it
    #: (memory creates a queue on first use: nothing is ever missing).
    check_finds_missing: bool = True
    #: A committed receive lowers `peek().depth` (Kafka's depth counts retained records).
    consuming_lowers_depth: bool = True
    #: A poison message's error-queue copy is written by the commit (Kafka writes it before the
    #: batch is handed out, once per record per source, even when the batch is aborted).
    poison_copied_at_commit: bool = True
    #: Exact report lines of a first `install`, a repeated one and a `print_only` one, for one
    #: address (None: only "a repeated install reports what the first did").
    install_lines: Lines | None = None
    reinstall_lines: Lines | None = None
    print_only_lines: Lines | None = None
    #: The connection's name appears in an unreachable error's message.
    names_connection_when_unreachable: bool = True
    #: What `offline` points at may come back (a server starting): its errors are retriable.
    #: SQLite has no server: its file in a directory that does not exist will not appear by
    #: retrying, so its errors are not retriable (and name the file).
    offline_comes_back: bool = True


# -- memory ----------------------------------------------------------------------------------


def memory(world: World) -> Transport:
    return Memory(broker=Broker())


async def memory_poison(world: World, transport: Transport, address: str, body: bytes) -> None:
    assert isinstance(transport, Memory)
    transport.put_poison(address, UNREADABLE, body)


# -- SQL -------------------------------------------------------------------------------------

OFFLINE_DSN = "postgresql://nobody:secret@127.0.0.1:1/none?connect_timeout=1"


def sqlite(world: World) -> Transport:
    return build("local", {"type": "sqlite", "path": world.sqlite_path})


def sqlite_offline(world: World) -> Transport:
    return build("offline", {"type": "sqlite", "path": str(world.tmp_path / "no" / "dir.db")})


async def sqlite_poison(world: World, transport: Transport, address: str, body: bytes) -> None:
    table = '"' + address.replace('"', '""') + '"'
    with contextlib.closing(sqlite3.connect(world.sqlite_path)) as db, db:
        db.execute(
            f"INSERT INTO {table} (id, headers, body) VALUES (?, ?, ?)",
            (str(uuid.uuid4()), UNREADABLE, body),
        )


def postgresql(world: World) -> Transport:
    settings = {"type": "postgresql", "dsn": world.pg_dsn, "schema": world.pg_schema}
    return build("shop", settings)


def postgresql_offline(world: World) -> Transport:
    return build("offline", {"type": "postgresql", "dsn": OFFLINE_DSN})


async def postgresql_poison(world: World, transport: Transport, address: str, body: bytes) -> None:
    import psycopg

    table = f'"{world.pg_schema}"."' + address.replace('"', '""') + '"'
    async with await psycopg.AsyncConnection.connect(world.pg_dsn) as pg:
        await pg.execute(
            f"INSERT INTO {table} (id, headers, body) VALUES (%s, %s, %s)",
            (str(uuid.uuid4()), UNREADABLE, body),
        )


# -- Kafka -----------------------------------------------------------------------------------

KAFKA = {
    "type": "kafka",
    "idempotence": False,
    "partitions": 1,  # one partition: the contract's order is a queue's
    "max_request_size": 4 * 1024 * 1024,
    "session_timeout_ms": 1500,  # a new member of a group joins in about half of it
}


#: How `install` describes a topic it creates for the settings above.
KAFKA_TOPIC = "partitions=1 replication=1 max.message.bytes=4194304"


def kafka(world: World) -> Transport:
    return build("kafka", {**KAFKA, "bootstrap_servers": world.kafka_bootstrap})


def kafka_offline(world: World) -> Transport:
    return build("offline", {**KAFKA, "bootstrap_servers": f"127.0.0.1:{free_port()}"})


async def kafka_poison(world: World, transport: Transport, address: str, body: bytes) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=world.kafka_bootstrap, enable_idempotence=False)
    await producer.start()
    try:
        await producer.send_and_wait(address, body, headers=[("bad", b"\xff\xfe")])
    finally:
        await producer.stop()


# -- RabbitMQ --------------------------------------------------------------------------------


def rabbitmq(world: World) -> Transport:
    return build("rabbit", {"type": "rabbitmq", "url": world.rabbitmq_url})


def rabbitmq_offline(world: World) -> Transport:
    return build("offline", {"type": "rabbitmq", "url": "amqp://g:secret@127.0.0.1:1/%2F"})


async def rabbitmq_poison(world: World, transport: Transport, address: str, body: bytes) -> None:
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(world.rabbitmq_url))
    try:
        properties = pika.BasicProperties(headers={"bad": b"\xff"}, delivery_mode=2)
        connection.channel().basic_publish("", address, body, properties)
    finally:
        connection.close()


def rabbitmq_declares(queue: str) -> list[str]:
    return [
        f"queue.declare queue={queue!r} durable=true arguments={{x-queue-type: quorum}}",
        f"exchange.declare exchange={queue!r} type=fanout durable=true",
        f"queue.bind queue={queue!r} exchange={queue!r} routing_key=''",
    ]


VARIANTS = [
    Variant(
        "memory",
        needs=(),
        make=memory,
        offline=None,
        put_poison=memory_poison,
        native_ids=False,
        check_finds_missing=False,
        install_lines=lambda a: [f"memory queue {a}"],
        print_only_lines=lambda a: [f"memory queue {a}"],
    ),
    Variant(
        "sqlite",
        needs=("sqlite_path",),
        make=sqlite,
        offline=sqlite_offline,
        put_poison=sqlite_poison,
        duplicate_headers=False,
        offline_comes_back=False,
    ),
    Variant(
        "postgresql",
        needs=("pg_dsn", "pg_schema"),
        make=postgresql,
        offline=postgresql_offline,
        put_poison=postgresql_poison,
        duplicate_headers=False,
    ),
    Variant(
        "kafka",
        needs=("kafka_bootstrap",),
        make=kafka,
        offline=kafka_offline,
        put_poison=kafka_poison,
        groups=True,
        consuming_lowers_depth=False,
        poison_copied_at_commit=False,
        install_lines=lambda t: [f"created topic {t} {KAFKA_TOPIC}"],
        reinstall_lines=lambda t: [f"topic {t} exists"],
        print_only_lines=lambda t: [f"create topic {t} {KAFKA_TOPIC}"],
        names_connection_when_unreachable=False,
    ),
    Variant(
        "rabbitmq",
        needs=("rabbitmq_url",),
        make=rabbitmq,
        offline=rabbitmq_offline,
        put_poison=rabbitmq_poison,
        duplicate_headers=False,
        native_ids=False,  # the message_id property, which any number of messages may share
        install_lines=rabbitmq_declares,  # printed as management API requests: not per name
    ),
]
