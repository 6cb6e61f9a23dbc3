"""What a sink writes, a source of the same transport reads back unchanged and in order."""

from __future__ import annotations

import time

import pytest

from bridge.envelope import Envelope, Headers
from tests.contract.conftest import Place, drain, eventually, nothing_more, receive

pytestmark = pytest.mark.contract


def message(i: int, body: bytes | None = None, **extra: str | None) -> Envelope:
    headers = Headers([("NServiceBus.MessageId", f"id-{i}"), *extra.items()])
    return Envelope(headers, f"body-{i}".encode() if body is None else body)


def ids(envelopes: list[Envelope]) -> list[str | None]:
    return [e.message_id for e in envelopes]


async def test_headers_and_bodies_cross_byte_for_byte(place: Place) -> None:
    headers = Headers(
        [
            ("NServiceBus.MessageId", "7f1b2c2e-0000-4000-8000-000000000001"),
            ("NServiceBus.ReplyToAddress", "Sales@[dbo]@[nservicebus]"),
            ("unicode", 'café / 東京 / \u2028 \U0001f600 "quoted" \\ back'),
            ("path/with/slashes", "a/b/c"),
            ("empty", ""),
            ("null", None),
            *[(f"h{i:03d}", f"v{i}") for i in range(200)],
        ]
    )
    bodies = [b"", bytes(range(256)) * 4, b"\x00\xff" * 10, "é".encode() * 1000]
    await place.send([Envelope(headers.copy(), body) for body in bodies])
    got, _ = await drain(place, len(bodies))
    assert [e.body for e in got] == bodies
    for envelope in got:
        assert envelope.headers.items() == headers.items()
    native = [e.native_id for e in got]
    assert (None not in native and len(set(native)) == len(got)) == place.variant.native_ids


async def test_a_repeated_header_name_keeps_every_value_in_order_where_it_can(
    place: Place,
) -> None:
    """Kafka records and memory keep each occurrence; a JSON object (SQL) or an AMQP table
    holds one value per name, the last, at the first occurrence's place."""
    headers = Headers(
        [("NServiceBus.MessageId", "m"), ("dup", "first"), ("other", "x"), ("dup", "second")]
    )
    await place.send([Envelope(headers.copy(), b"b")])
    (got,), _ = await drain(place, 1)
    if place.variant.duplicate_headers:
        assert got.headers.items() == headers.items()
    else:
        assert got.headers.items() == list(headers.to_dict().items())


async def test_one_mebibyte_body(place: Place) -> None:
    body = bytes(range(256)) * 4096
    await place.send([message(1, body)])
    (got,), _ = await drain(place, 1)
    assert got.body == body


async def test_fifo_order_across_sends_and_batches(place: Place) -> None:
    sink = place.sink()
    for start in range(0, 250, 50):
        await sink.send([message(i) for i in range(start, start + 50)])
    await sink.close()
    got, _ = await drain(place, 250, batch_size=37)
    assert ids(got) == [f"id-{i}" for i in range(250)]


async def test_sending_nothing_is_a_no_op(place: Place) -> None:
    sink = place.sink()
    await sink.send([])
    await sink.send([message(1)])
    await sink.send([])
    await sink.close()
    source = place.source()
    try:
        got, _ = await receive(source, 1)
        assert ids(got) == ["id-1"]
        assert await nothing_more(source)
    finally:
        await source.close()


async def test_peek_reports_depth(place: Place) -> None:
    empty = await place.transport.peek(place.address)
    assert (empty.depth, empty.oldest_age_seconds, empty.expired) == (0, None, 0)
    sink = place.sink()
    for i in range(5):  # one per send: tansu's end offset moves per produce request
        await sink.send([message(i)])
    await sink.close()

    async def depth_is(depth: int) -> bool:
        return (await place.transport.peek(place.address)).depth == depth

    await eventually(lambda: depth_is(5), "a depth of 5")
    await drain(place, 5)
    left = 0 if place.variant.consuming_lowers_depth else 5
    await eventually(lambda: depth_is(left), f"a depth of {left} after receiving")


async def test_remaining_time_to_live_is_carried(place: Place) -> None:
    envelope = message(1)
    envelope.headers.add("NServiceBus.TimeToBeReceived", "00:01:00")
    sent_at = time.time()
    envelope.expires_at = sent_at + 60
    await place.send([envelope, message(2)])
    (first, second), _ = await drain(place, 2)
    assert first.expires_at is not None
    assert abs(first.expires_at - (sent_at + 60)) < 2
    assert second.expires_at is None
