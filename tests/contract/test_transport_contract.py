"""What every transport promises the runner (bridge/protocols.py), checked on each one."""

from __future__ import annotations

import time

import pytest

from bridge.envelope import Envelope, Headers
from bridge.errors import SettleError
from tests.contract.conftest import Place

pytestmark = pytest.mark.contract


def message(i: int, body: bytes | None = None, **extra: str | None) -> Envelope:
    headers = Headers([("NServiceBus.MessageId", f"id-{i}"), *extra.items()])
    return Envelope(headers, f"body-{i}".encode() if body is None else body)


async def receive_all(place: Place, expected: int, batch_size: int = 100) -> list[Envelope]:
    source = place.source()
    got: list[Envelope] = []
    deadline = time.monotonic() + 20
    try:
        while len(got) < expected and time.monotonic() < deadline:
            batch = await source.receive_batch(batch_size, 1.0)
            async with batch:
                got.extend(batch.messages)
                await batch.commit()
    finally:
        await source.close()
    return got


async def test_headers_and_bodies_cross_byte_for_byte(place: Place) -> None:
    headers = Headers(
        [
            ("NServiceBus.MessageId", "7f1b2c2e-0000-4000-8000-000000000001"),
            ("NServiceBus.ReplyToAddress", "Sales@[dbo]@[nservicebus]"),
            ("unicode", 'café / 東京 / \u2028 "quoted" \\ back'),
            ("empty", ""),
            ("null", None),
            *[(f"h{i:03d}", f"v{i}") for i in range(200)],
        ]
    )
    bodies = [b"", bytes(range(256)) * 4, b"\x00" * 10, "é".encode() * 1000]
    sink = place.sink()
    await sink.send([Envelope(headers.copy(), body) for body in bodies])
    await sink.close()
    got = await receive_all(place, len(bodies))
    assert [e.body for e in got] == bodies
    for envelope in got:
        assert envelope.headers.items() == headers.items()


async def test_one_mebibyte_body(place: Place) -> None:
    body = bytes(range(256)) * 4096
    sink = place.sink()
    await sink.send([message(1, body)])
    await sink.close()
    (got,) = await receive_all(place, 1)
    assert got.body == body


async def test_fifo_order(place: Place) -> None:
    sink = place.sink()
    await sink.send([message(i) for i in range(300)])
    await sink.close()
    got = await receive_all(place, 300, batch_size=64)
    assert [e.message_id for e in got] == [f"id-{i}" for i in range(300)]


async def test_abort_returns_every_message(place: Place) -> None:
    sink = place.sink()
    await sink.send([message(i) for i in range(10)])
    await sink.close()
    source = place.source()
    try:
        batch = await source.receive_batch(10, 5.0)
        while not batch.messages:
            await batch.abort()
            batch = await source.receive_batch(10, 5.0)
        first = [e.message_id for e in batch.messages]
        await batch.abort()
        with pytest.raises(SettleError):
            await batch.commit()
    finally:
        await source.close()
    got = await receive_all(place, 10)
    assert [e.message_id for e in got][: len(first)] == first
    assert sorted(e.message_id or "" for e in got) == sorted(f"id-{i}" for i in range(10))


async def test_leaving_the_block_without_commit_aborts(place: Place) -> None:
    sink = place.sink()
    await sink.send([message(1)])
    await sink.close()
    source = place.source()
    try:
        with pytest.raises(RuntimeError):
            batch = await source.receive_batch(10, 5.0)
            async with batch:
                assert batch.messages
                raise RuntimeError("crash before commit")
    finally:
        await source.close()
    got = await receive_all(place, 1)
    assert [e.message_id for e in got] == ["id-1"]


async def test_commit_removes_and_settling_twice_is_an_error(place: Place) -> None:
    sink = place.sink()
    await sink.send([message(1)])
    await sink.close()
    assert len(await receive_all(place, 1)) == 1
    source = place.source()
    try:
        batch = await source.receive_batch(10, 0.3)
        assert not batch.messages
        await batch.commit()
        with pytest.raises(SettleError):
            await batch.abort()
    finally:
        await source.close()


async def test_empty_receive_returns_within_its_timeout(place: Place) -> None:
    source = place.source()
    try:
        await (await source.receive_batch(10, 0.2)).abort()  # warm up (Kafka joins its group)
        started = time.monotonic()
        batch = await source.receive_batch(10, 0.3)
        await batch.abort()
        assert not batch.messages
        assert time.monotonic() - started < 3.0
    finally:
        await source.close()


async def test_remaining_time_to_live_is_carried(place: Place) -> None:
    envelope = message(1, **{"NServiceBus.TimeToBeReceived": "00:01:00"})
    sent_at = time.time()
    envelope.expires_at = sent_at + 60
    sink = place.sink()
    await sink.send([envelope, message(2)])
    await sink.close()
    first, second = await receive_all(place, 2)
    assert first.expires_at is not None
    assert abs(first.expires_at - (sent_at + 60)) < 2
    assert second.expires_at is None
