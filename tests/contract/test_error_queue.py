"""Poison and rejected messages leave for the source's error queue when their batch commits,
body unchanged, with the failure headers ServiceControl reads; the rest of the batch goes on."""

from __future__ import annotations

import socket
import time

import pytest

from bridge.envelope import Envelope, Headers, PoisonMessage
from bridge.errors import MessageRejected
from bridge.nservicebus.host import host_id
from bridge.protocols import ReceivedBatch, Source
from tests.contract.conftest import PATIENCE, Place, nothing_more, receive

pytestmark = pytest.mark.contract


def message(i: int, **extra: str) -> Envelope:
    headers = Headers([("NServiceBus.MessageId", f"id-{i}"), *extra.items()])
    return Envelope(headers, f"body-{i}".encode())


def assert_failure_headers(headers: Headers, place: Place, exception_type: str) -> None:
    assert headers.get("NServiceBus.FailedQ") == place.transport.canonical_address(place.address)
    assert headers.get("NServiceBus.ExceptionInfo.ExceptionType") == exception_type
    assert headers.get("NServiceBus.ExceptionInfo.Message")
    assert (headers.get("NServiceBus.TimeOfFailure") or "").endswith(" Z")
    assert headers.get("NServiceBus.ProcessingEndpoint") == "bridge"
    # The host ServiceControl files the failure under (CORE RecoverabilityComponent.cs:150-156;
    # SC EndpointDetailsParser.cs:40-53 needs a Guid in $.diagnostics.hostid for a HostId):
    # this bridge's host (tests/unit/test_nservicebus_deadletter.py pins how it is made).
    assert headers.get("$.diagnostics.hostid") == host_id()
    assert headers.get("$.diagnostics.hostdisplayname") == socket.gethostname()
    assert headers.get("NServiceBus.ProcessingMachine") == socket.gethostname()


async def whole_batch(source: Source, count: int) -> ReceivedBatch:
    """A batch holding all `count` waiting items (messages and poison)."""
    deadline = time.monotonic() + PATIENCE
    batch = await source.receive_batch(10, 1.0)
    while len(batch.messages) + len(batch.poison) < count:
        await batch.abort()
        assert time.monotonic() < deadline, f"the {count} items never came in one batch"
        batch = await source.receive_batch(10, 1.0)
    return batch


async def look(place: Place, address: str, count: int) -> list[Envelope | PoisonMessage]:
    """The `count` items at `address`, left there; nothing more waits behind them. A copy whose
    own headers cannot be read (Kafka, RabbitMQ keep the original ones) is poison again."""
    source = place.source(address)
    try:
        batch = await whole_batch(source, count)
        await batch.abort()
        items: list[Envelope | PoisonMessage] = [*batch.messages, *batch.poison]
        assert len(items) == count, items
        return items
    finally:
        await source.close()


async def test_poison_goes_to_the_error_queue_unchanged_and_the_rest_goes_on(
    place: Place,
) -> None:
    errors = await place.fresh("error")
    await place.send([message(1)])
    await place.put_poison(b"\x00raw \xff")
    await place.send([message(2)])
    source = place.source(error_queue=errors)
    try:
        batch = await whole_batch(source, 3)
        assert [e.message_id for e in batch.messages] == ["id-1", "id-2"]
        (poison,) = batch.poison
        assert poison.body == b"\x00raw \xff" and poison.reason
        await batch.abort()
        if place.variant.poison_copied_at_commit:
            assert (await place.transport.peek(errors)).depth == 0  # nothing moved yet
        messages, poison_again = await receive(source, 3)
        assert [e.message_id for e in messages] == ["id-1", "id-2"]
        assert [p.body for p in poison_again] == [b"\x00raw \xff"]
        assert await nothing_more(source)
    finally:
        await source.close()
    (copy,) = await look(place, errors, 1)  # one copy, though its batch came twice
    assert copy.body == b"\x00raw \xff"
    assert_failure_headers(copy.headers, place, "HeadersFormatError")


async def test_a_rejected_message_goes_to_the_error_queue_and_the_rest_goes_on(
    place: Place,
) -> None:
    errors = await place.fresh("error")
    sent = [message(i, keep="me", empty="") for i in range(3)]
    await place.send(sent)
    source = place.source(error_queue=errors)
    try:
        batch = await whole_batch(source, 3)
        assert [e.message_id for e in batch.messages] == ["id-0", "id-1", "id-2"]
        batch.reject(batch.messages[1], MessageRejected("too large for the destination", 1))
        await batch.commit()
        await place.send([message(3)])
        later, _ = await receive(source, 1)
        assert [e.message_id for e in later] == ["id-3"]
        assert await nothing_more(source)
    finally:
        await source.close()
    (copy,) = await look(place, errors, 1)
    assert isinstance(copy, Envelope) and copy.body == b"body-1"
    for name, value in sent[1].headers.items():
        assert copy.headers.get(name) == value, name
    assert_failure_headers(copy.headers, place, "bridge.errors.MessageRejected")
    assert (copy.headers.get("NServiceBus.ExceptionInfo.Message") or "").startswith("too large")
