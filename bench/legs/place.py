"""What every place does: one address on one connection, written and read with a raw driver."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

from bench.messages import Message

__all__ = ["PACE_WAIT", "PG_DSN", "POLL", "RABBITMQ_URL", "Place", "chunks", "pacing"]

PG_DSN = os.environ.get("BRIDGE_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
RABBITMQ_URL = os.environ.get("BRIDGE_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")

POLL = 0.002  # seconds between polls of a latency consumer that found nothing
PACE_WAIT = 0.0005  # seconds a paced writer waits when nothing is due yet


def pacing(rate: float, seconds: float) -> Iterator[tuple[int, int]]:
    """A paced writer's steps, `rate` messages a second for `seconds`: (how many were written
    before, how many are due now); 0 due means wait (`PACE_WAIT` seconds) and ask again."""
    sent, started = 0, time.monotonic()
    total = int(rate * seconds)
    while sent < total:
        due = min(total, int((time.monotonic() - started) * rate) + 1) - sent
        yield sent, max(0, due)
        sent += max(0, due)


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class Place:
    """One address on one connection. Subclasses fill in the driver work."""

    kind = ""
    connection = ""  # name of the connection in routes.yaml

    def __init__(self, address: str) -> None:
        self.address = address
        #: when (time.time()) each latency `timed` returned was taken, in the same order
        self.arrivals: list[float] = []

    def connection_yaml(self) -> str:
        raise NotImplementedError

    def endpoint_yaml(self, role: str, group: str = "") -> str:
        return f"{{connection: {self.connection}, queue: {json.dumps(self.address)}}}"

    async def create(self) -> None:
        raise NotImplementedError

    async def drop(self) -> None:
        raise NotImplementedError

    async def write(self, messages: Sequence[Message], batch: int) -> float:
        """Write everything, `batch` per transaction/window; seconds taken."""
        raise NotImplementedError

    async def read(self, count: int, batch: int) -> float:
        """Take `count` messages, `batch` at a time, settling each; seconds from the first."""
        raise NotImplementedError

    async def paced(self, rate: float, seconds: float, size: int) -> int:
        """Write `rate` messages a second for `seconds`, each stamped when written."""
        raise NotImplementedError

    async def timed(self, expected: int, since: float, first: int, timeout: float) -> list[float]:
        """Consume until `expected` messages written after `since`, numbered `first` or later by
        `paced`, arrived; their latencies (the earlier ones are a warm-up), and when each arrived
        in `arrivals`."""
        raise NotImplementedError
