"""Which record a failed send blames, with aiokafka's `send` per record (`send_each`).

aiokafka fails every record of a refused record batch with a copy of the same error, and its
`send` does not say which records shared a batch: several records failing alike blame none
(the runner then sends each message alone), one alone is blamed by its index.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, RecordTooLargeError

from bridge.errors import MessageRejected, TransportUnavailable
from bridge.transports.kafka import producer as producer_module
from bridge.transports.kafka.headers import Record
from bridge.transports.kafka.producer import produce, send_each


class FailingProducer:
    """Acknowledges every record but those in `failures` (index -> the error it fails with)."""

    def __init__(self, failures: dict[int, BaseException]) -> None:
        self._failures = failures
        self.sent: list[bytes] = []

    async def send(self, topic: str, value: bytes, **_: Any) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        index = len(self.sent)
        self.sent.append(value)
        if index in self._failures:
            future.set_exception(self._failures[index])
        else:
            future.set_result(None)
        return future


def records(count: int) -> list[Record]:
    return [Record(None, str(i).encode(), [], 0) for i in range(count)]


@pytest.mark.parametrize(
    ("failures", "expected", "index"),
    [
        ({2: RecordTooLargeError()}, MessageRejected, 2),
        ({1: RecordTooLargeError(), 2: RecordTooLargeError()}, MessageRejected, None),
        ({3: KafkaConnectionError("gone")}, TransportUnavailable, None),
    ],
)
async def test_the_plain_send_blames_a_record_only_when_it_failed_alone(
    monkeypatch: pytest.MonkeyPatch,
    failures: dict[int, BaseException],
    expected: type[Exception],
    index: int | None,
) -> None:
    monkeypatch.setattr(producer_module, "send_records", send_each)
    fake = FailingProducer(failures)

    async def started() -> FailingProducer:
        return fake

    with pytest.raises(expected) as caught:
        await produce(started, "t", records(5), 1_000_000)
    assert type(caught.value) is expected
    assert getattr(caught.value, "index", None) == index
    assert fake.sent == [str(i).encode() for i in range(5)]  # every record was handed over


async def test_the_plain_send_returns_once_every_record_is_acknowledged() -> None:
    fake = FailingProducer({})
    assert await send_each(fake, "t", records(4)) is None
    assert len(fake.sent) == 4
