"""How poison and rejected messages reach a Kafka source's error topic.

A poison record (headers that are not UTF-8) is copied byte for byte (key, value, headers) with
the NServiceBus failure headers appended (`error_record`), once per record per source even when
its batch is aborted and received again. A message the destination refused for good is written
as its error-queue copy (`bridge.nservicebus.deadletter.error_copy`) laid out like any record.
Both go through the connection's shared producer (`producer.produce`), so they are acknowledged
by every in-sync replica before the batch they came with is handed out or committed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from aiokafka import TopicPartition

from bridge.batch import Rejected
from bridge.envelope import MESSAGE_ID, PoisonMessage
from bridge.nservicebus.deadletter import error_copy, failure_headers
from bridge.transports.kafka.headers import DEFAULT_KEY, Record, RecordHeaders, outgoing
from bridge.transports.kafka.producer import ProducerFactory, produce

__all__ = ["ErrorQueue", "error_record"]


class ErrorQueue:
    """A Kafka source's error topic: poison copies (once each) and rejected messages."""

    def __init__(
        self, producer: ProducerFactory, topic: str, failed_q: str, max_request_size: int
    ) -> None:
        self.topic = topic
        self._producer = producer
        self._failed_q = failed_q
        self._max_request_size = max_request_size
        self._copied: set[tuple[TopicPartition, int]] = set()  # poison already copied

    async def copy_poison(self, poison: list[tuple[Any, PoisonMessage]]) -> None:
        """Copy each poison record byte for byte, plus failure headers; once per record."""
        now = time.time()
        todo = [
            (where, error_record(r.key, r.headers, copy, self._failed_q, now))
            for r, copy in poison
            if (where := (TopicPartition(r.topic, r.partition), r.offset)) not in self._copied
        ]
        if todo:
            records = [record for _, record in todo]
            await produce(self._producer, self.topic, records, self._max_request_size)
            self._copied.update(where for where, _ in todo)

    async def dead_letter(self, rejected: list[Rejected]) -> None:
        """Write the error-queue copies of messages the destination refused for good."""
        now = time.time()
        records = [
            outgoing(error_copy(r.envelope, r.error, self._failed_q), DEFAULT_KEY, now)
            for r in rejected
        ]
        await produce(self._producer, self.topic, records, self._max_request_size)

    def forget(self, keep: Callable[[TopicPartition, int], bool]) -> None:
        """Drop what no longer needs remembering (committed, or another owner's now)."""
        self._copied = {(tp, offset) for tp, offset in self._copied if keep(tp, offset)}


def error_record(
    key: bytes | None,
    headers: RecordHeaders,
    poison: PoisonMessage,
    failed_q: str,
    now: float,
) -> Record:
    """The error-queue copy of a poison record: its key, value and headers byte for byte, with
    the failure headers ServiceControl reads appended (the last occurrence wins on read).

    A record without `NServiceBus.MessageId` also gets its deterministic id, so ServicePulse
    can retry it to `failed_q`.
    """
    failure: list[tuple[str, str | None]] = list(
        failure_headers(poison.reason, failed_q, exception_type=poison.exception_type)
    )
    if not any(name == MESSAGE_ID for name, _ in headers):
        failure.insert(0, (MESSAGE_ID, poison.headers.get(MESSAGE_ID)))
    encoded = [(name, None if value is None else value.encode()) for name, value in failure]
    return Record(key, poison.body, [*headers, *encoded], int(now * 1000))
