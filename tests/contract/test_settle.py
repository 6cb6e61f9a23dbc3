"""One settle interface (protocols.py, batch.py): messages stay at the source until their batch
commits; abort, leaving the block, cancelling or closing returns them; settling twice is an
error."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from bridge.envelope import Envelope, Headers
from bridge.errors import MessageRejected, SettleError
from bridge.protocols import ReceivedBatch, Source
from tests.contract.conftest import PATIENCE, Place, drain, nothing_more, receive

pytestmark = pytest.mark.contract


def message(i: int) -> Envelope:
    return Envelope(Headers([("NServiceBus.MessageId", f"id-{i}")]), f"body-{i}".encode())


def ids(envelopes: list[Envelope]) -> list[str | None]:
    return [e.message_id for e in envelopes]


def every(start: int, stop: int) -> list[str | None]:
    return [f"id-{i}" for i in range(start, stop)]


async def first_batch(source: Source, max_messages: int) -> ReceivedBatch:
    """The first batch holding anything (a Kafka source's first receives may only join)."""
    deadline = time.monotonic() + PATIENCE
    while True:
        batch = await source.receive_batch(max_messages, 1.0)
        if batch.messages or batch.poison:
            return batch
        await batch.abort()
        assert time.monotonic() < deadline, "no batch arrived"


async def test_abort_returns_every_message_in_order(place: Place) -> None:
    await place.send([message(i) for i in range(20)])
    source = place.source()
    try:
        batch = await first_batch(source, 5)
        taken = [(e.native_id, e.message_id, e.body) for e in batch.messages]
        assert [m for _, m, _ in taken] == every(0, len(taken))
        await batch.abort()
        with pytest.raises(SettleError):
            await batch.commit()
        again = await first_batch(source, len(taken))
        assert [(e.native_id, e.message_id, e.body) for e in again.messages] == taken
        await again.abort()
        got, _ = await receive(source, 20, batch_size=7)
        assert ids(got) == every(0, 20)
        assert await nothing_more(source)
    finally:
        await source.close()


async def test_leaving_the_block_without_commit_returns_everything(place: Place) -> None:
    await place.send([message(i) for i in range(3)])
    source = place.source()
    try:
        with pytest.raises(RuntimeError):
            batch = await first_batch(source, 10)
            async with batch:
                raise RuntimeError("crash before commit")
        with pytest.raises(SettleError):
            await batch.commit()
    finally:
        await source.close()
    got, _ = await drain(place, 3)
    assert ids(got) == every(0, 3)


async def test_commit_removes_exactly_what_was_received(place: Place) -> None:
    await place.send([message(i) for i in range(10)])
    source = place.source()
    try:
        batch = await first_batch(source, 4)
        taken = len(batch.messages)
        assert ids(list(batch.messages)) == every(0, taken)
        await batch.commit()
    finally:
        await source.close()
    source = place.source()  # a new source: the commit is the source's, not this object's
    try:
        rest, _ = await receive(source, 10 - taken)
        assert ids(rest) == every(taken, 10)
        assert await nothing_more(source)
    finally:
        await source.close()


async def test_settling_twice_is_an_error(place: Place) -> None:
    source = place.source()
    try:
        empty = await source.receive_batch(10, 0.3)
        await empty.commit()
        with pytest.raises(SettleError):
            await empty.abort()
        await place.send([message(1), message(2)])
        committed = await first_batch(source, 1)
        await committed.commit()
        for settle in (committed.commit, committed.abort):
            with pytest.raises(SettleError):
                await settle()
        with pytest.raises(SettleError):
            committed.reject(committed.messages[0], MessageRejected("late"))
        aborted = await first_batch(source, 1)
        await aborted.abort()
        for settle in (aborted.commit, aborted.abort):
            with pytest.raises(SettleError):
                await settle()
    finally:
        await source.close()
    got, _ = await drain(place, 1)
    assert ids(got) == ["id-2"]


async def test_a_cancelled_receive_loses_nothing(place: Place) -> None:
    source = place.source()
    try:
        waiting = asyncio.create_task(source.receive_batch(10, PATIENCE))
        await asyncio.sleep(0)  # the receive is waiting before anything arrives
        await place.send([message(1)])  # the receive runs while the send waits on I/O
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            batch = await waiting
            await batch.abort()
    finally:
        await source.close()
    got, _ = await drain(place, 1)
    assert ids(got) == ["id-1"]


async def test_closing_a_source_with_a_batch_in_hand_returns_it(place: Place) -> None:
    await place.send([message(i) for i in range(10)])
    source = place.source()
    committed = await first_batch(source, 4)
    done = len(committed.messages)
    await committed.commit()
    held = await first_batch(source, 3)
    assert ids(list(held.messages)) == every(done, done + len(held.messages))
    await source.close()  # without settling `held`
    got, _ = await drain(place, 10 - done)
    assert ids(got) == every(done, 10)


async def test_close_is_idempotent(place: Place) -> None:
    await place.send([message(1)])
    source, sink = place.source(), place.sink()
    unused_source, unused_sink = place.source(), place.sink()
    await sink.send([message(2)])
    got, _ = await receive(source, 2)
    assert ids(got) == ["id-1", "id-2"]
    for closeable in (source, sink, unused_source, unused_sink):
        await closeable.close()
        await closeable.close()
    await place.transport.close()
    await place.transport.close()


async def test_an_empty_receive_returns_within_its_timeout(place: Place) -> None:
    source = place.source()
    try:
        await (await source.receive_batch(10, 0.2)).abort()  # warm up (Kafka joins its group)
        started = time.monotonic()
        batch = await source.receive_batch(10, 0.3)
        await batch.abort()
        assert not batch.messages and not batch.poison
        assert time.monotonic() - started < 3.0
    finally:
        await source.close()
