"""Kafka sink: envelopes become records on one topic, acknowledged by every in-sync replica.

Guarantees
    `send` returns only when every record of the call is acknowledged with `acks=all`, through
    the transport's one shared producer (`producer.py`: records of a call go out together,
    records with the same key go to the same partition in the order of `envelopes`).

What is lossy
    Nothing of the envelope (see `headers.py` for the record layout). The sink is not a
    checkpoint store: Kafka destinations are at-least-once, and `checkpoint` is ignored. A
    record the producer retried after a lost acknowledgement may be written twice unless the
    connection has `idempotence: true`.

Errors
    `MessageRejected(index)` when a record can never be written: a header that is not UTF-8
    text, or what `producer.py` rejects (too large, an invalid timestamp, a topic the cluster
    does not have: `bridge check --connect` finds that one up front). `TransportUnavailable`
    for what may go away (connection, timeouts, leader changes); `TransportError` for the rest
    (see `errors.py`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from bridge.envelope import Envelope
from bridge.errors import HeadersFormatError, MessageRejected
from bridge.nservicebus.delays import refuse_delays
from bridge.protocols import Checkpoint
from bridge.transports.kafka.headers import Record, key_header, outgoing
from bridge.transports.kafka.producer import ProducerFactory, produce

__all__ = ["KafkaSink"]


class KafkaSink:
    def __init__(
        self, topic: str, key_spec: str, producer: ProducerFactory, max_request_size: int
    ) -> None:
        key_header(key_spec)  # a bad key spec fails when the route is built, not at first send
        self.topic = topic
        self._key_spec = key_spec
        self._producer = producer
        self._max_request_size = max_request_size

    async def send(
        self, envelopes: Sequence[Envelope], checkpoint: Checkpoint | None = None
    ) -> None:
        if not envelopes:
            return
        now = time.time()
        refuse_delays(envelopes, now, f"kafka: topic {self.topic!r} (no `delays:` connection)")
        records: list[Record] = []
        for index, envelope in enumerate(envelopes):
            try:
                records.append(outgoing(envelope, self._key_spec, now))
            except HeadersFormatError as exc:
                raise MessageRejected(f"kafka: topic {self.topic!r}: {exc}", index=index) from exc
        await produce(self._producer, self.topic, records, self._max_request_size)

    async def close(self) -> None:
        """Nothing to release: the producer belongs to the transport and outlives its sinks."""
