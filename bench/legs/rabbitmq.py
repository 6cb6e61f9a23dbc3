"""A RabbitMQ quorum queue behind its fanout exchange, written and read with pika."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pika

from bench.legs.place import PACE_WAIT, Place, pacing
from bench.messages import NUMBER, WRITTEN_AT, Message, body_of, headers_of
from bridge.config.models import RabbitMQConnection
from bridge.envelope import Envelope, Headers
from bridge.transports import load
from bridge.transports.rabbitmq.headers import outgoing

__all__ = ["RabbitPlace"]


class RabbitPlace(Place):
    """A quorum queue behind its conventional fanout exchange (the bridge's defaults)."""

    kind = "rabbitmq"
    connection = "rabbit"

    def __init__(self, address: str, url: str) -> None:
        super().__init__(address)
        self.url = url
        self.config = RabbitMQConnection(type="rabbitmq", url=url)

    def connection_yaml(self) -> str:
        return f"{{type: rabbitmq, url: {json.dumps(self.url)}}}"

    async def create(self) -> None:
        transport = load("bench", self.config)
        await transport.install([self.address])
        await transport.close()

    def blocking(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.URLParameters(self.url))

    async def drop(self) -> None:
        def run() -> None:
            connection = self.blocking()
            try:
                channel = connection.channel()
                channel.queue_delete(self.address)
                channel.exchange_delete(self.address)
            finally:
                connection.close()

        await asyncio.to_thread(run)

    @staticmethod
    def amqp(messages: Sequence[Message]) -> list[tuple[pika.BasicProperties, bytes]]:
        now = time.time()
        return [outgoing(Envelope(Headers(h.items()), body), now) for h, body in messages]

    def depth(self) -> Callable[[], int]:
        connection = self.blocking()
        channel = connection.channel()

        def ready() -> int:
            method = channel.queue_declare(self.address, passive=True).method
            return int(method.message_count)

        return ready

    async def count(self) -> int:
        def run() -> int:
            connection = self.blocking()
            try:
                method = connection.channel().queue_declare(self.address, passive=True).method
                return int(method.message_count)
            finally:
                connection.close()

        return await asyncio.to_thread(run)

    async def clear(self) -> None:
        def run() -> None:
            connection = self.blocking()
            try:
                connection.channel().queue_purge(self.address)
            finally:
                connection.close()

        await asyncio.to_thread(run)

    async def write(self, messages: Sequence[Message], batch: int) -> float:
        """Windows of `batch` messages in flight, each window fully confirmed before the next."""
        return await asyncio.to_thread(
            _confirm_windows, self.url, self.address, self.amqp(messages), batch
        )

    async def read(self, count: int, batch: int) -> float:
        """Consume with prefetch max(500, batch), acknowledging every `batch` (multiple)."""

        def run() -> float:
            connection = self.blocking()
            try:
                channel = connection.channel()
                channel.basic_qos(prefetch_count=max(500, batch))
                started = 0.0
                for got, (method, _, _) in enumerate(
                    channel.consume(self.address, inactivity_timeout=5), 1
                ):
                    if method is None:
                        break
                    if not started:
                        started = time.perf_counter()
                    last = method.delivery_tag
                    if got % batch == 0 or got == count:
                        channel.basic_ack(last, multiple=True)
                    if got >= count:
                        break
                elapsed = time.perf_counter() - started
                channel.cancel()
                return elapsed
            finally:
                connection.close()

        return await asyncio.to_thread(run)

    async def paced(self, rate: float, seconds: float, size: int) -> int:
        body = body_of(size)

        def run() -> int:
            connection = self.blocking()
            try:
                channel = connection.channel()
                sent = 0
                for before, due in pacing(rate, seconds):
                    if not due:
                        time.sleep(PACE_WAIT)
                        continue
                    now = time.time()
                    for props, data in self.amqp(
                        [(headers_of(before + i, now), body) for i in range(due)]
                    ):
                        channel.basic_publish(self.address, "", data, props)
                    sent = before + due
                connection.process_data_events(0)
                return sent
            finally:
                connection.close()

        return await asyncio.to_thread(run)

    async def timed(self, expected: int, since: float, first: int, timeout: float) -> list[float]:
        def run() -> list[float]:
            connection = self.blocking()
            latencies: list[float] = []
            deadline = time.monotonic() + timeout
            try:
                channel = connection.channel()
                channel.basic_qos(prefetch_count=1000)
                for method, props, _ in channel.consume(
                    self.address, auto_ack=True, inactivity_timeout=0.5
                ):
                    if method is not None:
                        written = float(props.headers[WRITTEN_AT])
                        if written >= since and int(props.headers[NUMBER]) >= first:
                            now = time.time()
                            latencies.append(now - written)
                            self.arrivals.append(now)
                    if len(latencies) >= expected or time.monotonic() > deadline:
                        break
                channel.cancel()
                return latencies
            finally:
                connection.close()

        return await asyncio.to_thread(run)


def _confirm_windows(
    url: str, exchange: str, messages: Sequence[tuple[pika.BasicProperties, bytes]], window: int
) -> float:
    """Publish through a SelectConnection (pika's asynchronous adapter, as the bridge uses):
    `window` messages in flight, the next window once every confirm of this one arrived."""
    state: dict[str, Any] = {"next": 0, "unconfirmed": 0, "started": 0.0, "elapsed": 0.0}
    done = threading.Event()

    def publish_window(channel: Any) -> None:
        start = state["next"]
        chunk = messages[start : start + window]
        if not chunk:
            state["elapsed"] = time.perf_counter() - state["started"]
            channel.connection.close()
            return
        state["next"] = start + len(chunk)
        state["unconfirmed"] = len(chunk)
        for props, body in chunk:
            channel.basic_publish(exchange, "", body, props)

    def on_channel(channel: Any) -> None:
        def on_confirm(frame: Any) -> None:
            method = frame.method
            state["unconfirmed"] -= (
                method.delivery_tag - state["confirmed_tag"] if method.multiple else 1
            )
            state["confirmed_tag"] = max(state["confirmed_tag"], method.delivery_tag)
            if state["unconfirmed"] <= 0:
                publish_window(channel)

        def on_select(_: Any) -> None:
            state["started"] = time.perf_counter()
            publish_window(channel)

        state["confirmed_tag"] = 0
        channel.confirm_delivery(on_confirm, callback=on_select)

    def on_open(connection: Any) -> None:
        connection.channel(on_open_callback=on_channel)

    def on_closed(connection: Any, reason: Any) -> None:
        connection.ioloop.stop()
        done.set()

    connection = pika.SelectConnection(
        pika.URLParameters(url), on_open_callback=on_open, on_close_callback=on_closed
    )
    connection.ioloop.start()
    done.wait()
    return float(state["elapsed"])
