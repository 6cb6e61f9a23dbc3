"""The `place` fixture: one transport of each variant (tests/contract/variants.py) and fresh
addresses on it. Memory and SQLite always run; PostgreSQL, Kafka and RabbitMQ need their
services and fail (never skip) when those are missing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bridge.envelope import Envelope, PoisonMessage
from bridge.protocols import Sink, Source, Transport
from tests.conftest import unique
from tests.contract.variants import VARIANTS, Variant, World

#: How long a condition a test waits for may take (a Kafka group join takes seconds).
PATIENCE = 30.0


@dataclass
class Place:
    """A transport under test, one installed address on it, and its variant's differences."""

    variant: Variant
    world: World
    transport: Transport
    address: str
    group: str | None = None
    addresses: list[str] = field(default_factory=list)

    async def fresh(self, prefix: str = "q") -> str:
        """Another installed address, removed with the place."""
        address = unique(prefix)
        await self.transport.install([address])
        self.addresses.append(address)
        return address

    def source(self, address: str | None = None, *, error_queue: str | None = None) -> Source:
        """A source of `address` (default the place's); Kafka sources of the place's address
        share its group, any other address gets a group of its own."""
        group = None
        if self.variant.groups:
            group = self.group if address in (None, self.address) else unique("g")
        return self.transport.source(address or self.address, group=group, error_queue=error_queue)

    def sink(self, address: str | None = None) -> Sink:
        return self.transport.sink(address or self.address)

    async def send(self, envelopes: list[Envelope], address: str | None = None) -> None:
        sink = self.sink(address)
        try:
            await sink.send(envelopes)
        finally:
            await sink.close()

    async def put_poison(self, body: bytes, address: str | None = None) -> None:
        await self.variant.put_poison(self.world, self.transport, address or self.address, body)


async def eventually(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    """Wait until `condition` holds (RabbitMQ requeues and Kafka group joins are async)."""
    deadline = time.monotonic() + PATIENCE
    while not await condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.02)


async def receive(
    source: Source, count: int, batch_size: int = 100
) -> tuple[list[Envelope], list[PoisonMessage]]:
    """Receive and commit until `count` items (messages and poison) arrived."""
    messages: list[Envelope] = []
    poison: list[PoisonMessage] = []
    deadline = time.monotonic() + PATIENCE
    while len(messages) + len(poison) < count:
        assert time.monotonic() < deadline, f"received {len(messages) + len(poison)} of {count}"
        batch = await source.receive_batch(batch_size, 1.0)
        async with batch:
            messages.extend(batch.messages)
            poison.extend(batch.poison)
            await batch.commit()
    return messages, poison


async def drain(
    place: Place, count: int, address: str | None = None, batch_size: int = 100
) -> tuple[list[Envelope], list[PoisonMessage]]:
    """`receive` on a new source of `address`, closed afterwards."""
    source = place.source(address)
    try:
        return await receive(source, count, batch_size)
    finally:
        await source.close()


async def nothing_more(source: Source) -> bool:
    batch = await source.receive_batch(100, 0.5)
    await batch.abort()
    return not batch.messages and not batch.poison


def world(request: pytest.FixtureRequest, variant: Variant, tmp_path: Path) -> World:
    found = World(tmp_path)
    for name in variant.needs:
        setattr(found, name, request.getfixturevalue(name))
    return found


@pytest.fixture(params=VARIANTS, ids=[v.name for v in VARIANTS])
def variant(request: pytest.FixtureRequest) -> Variant:
    found: Variant = request.param
    return found


@pytest.fixture
async def place(
    request: pytest.FixtureRequest, variant: Variant, tmp_path: Path
) -> AsyncIterator[Place]:
    here = world(request, variant, tmp_path)
    transport = variant.make(here)
    address = unique("q")
    await transport.install([address])
    found = Place(variant, here, transport, address, unique("g"), [address])
    try:
        yield found
    finally:
        await transport.close()
        if variant.name == "rabbitmq":
            delete_rabbitmq(here.rabbitmq_url, found.addresses)


OFFLINE = [v for v in VARIANTS if v.offline is not None]


@dataclass
class Offline:
    variant: Variant
    transport: Transport
    tmp_path: Path


@pytest.fixture(params=OFFLINE, ids=[v.name for v in OFFLINE])
async def offline(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Offline]:
    """A transport of each variant that has something to reach, pointed where nothing is."""
    variant: Variant = request.param
    assert variant.offline is not None
    transport = variant.offline(World(tmp_path))
    try:
        yield Offline(variant, transport, tmp_path)
    finally:
        await transport.close()


def delete_rabbitmq(url: str, queues: list[str]) -> None:
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    for queue in queues:
        channel.queue_delete(queue)
        channel.exchange_delete(queue)
    connection.close()
