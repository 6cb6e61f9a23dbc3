"""The RabbitMQ source's inbox (rabbitmq/inbox.py): deliveries cross from pika's ioloop thread
to the event loop, which is woken only when a receive waits for what has arrived."""

from __future__ import annotations

import asyncio
import threading
import time

import pika

from bridge.errors import TransportUnavailable
from bridge.transports.rabbitmq.inbox import Delivery, Inbox


def delivery(tag: int, consumer: int = 1) -> Delivery:
    return Delivery(consumer, 1, tag, pika.BasicProperties(), b"")


class CountingLoop:
    """Counts the wake-ups `Inbox.put` posts to the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.wakes = 0
        self._loop = loop

    def __getattr__(self, name: str) -> object:
        return getattr(self._loop, name)

    def call_soon_threadsafe(self, callback: object, *args: object) -> object:
        self.wakes += 1
        return self._loop.call_soon_threadsafe(callback, *args)  # type: ignore[arg-type]


async def test_deliveries_while_nobody_waits_wake_nothing() -> None:
    loop = CountingLoop(asyncio.get_running_loop())
    inbox = Inbox(loop)  # type: ignore[arg-type]
    for tag in range(1, 51):
        inbox.put(delivery(tag))
    assert loop.wakes == 0
    assert await inbox.wait_for(1, 50, 0.0)  # already there: no wait
    assert [d.tag for d in inbox.take(1, 100)] == list(range(1, 51))


async def test_a_waiting_receive_is_woken_once_when_its_deliveries_are_there() -> None:
    loop = CountingLoop(asyncio.get_running_loop())
    inbox = Inbox(loop)  # type: ignore[arg-type]
    waiting = asyncio.create_task(inbox.wait_for(1, 30, 5.0))
    await asyncio.sleep(0.01)

    def deliver() -> None:  # as pika's ioloop thread does
        for tag in range(1, 41):
            inbox.put(delivery(tag))

    thread = threading.Thread(target=deliver)
    thread.start()
    assert await waiting
    thread.join()
    assert loop.wakes == 1
    assert len(inbox.take(1, 100)) == 40


async def test_a_wait_times_out_and_deliveries_of_an_earlier_consumer_are_dropped() -> None:
    inbox = Inbox(asyncio.get_running_loop())
    inbox.put(delivery(1, consumer=1))
    inbox.put(delivery(2, consumer=2))
    assert not await inbox.wait_for(2, 2, 0.02)
    assert [d.tag for d in inbox.take(2, 10)] == [2]


async def test_first_arrived_is_the_oldest_waiting_delivery_of_the_consumer() -> None:
    """A receive counts its gathering time from here (`GATHER_LIMIT`), so it must move on as
    deliveries are taken and skip those of a consumer that is gone."""
    inbox = Inbox(asyncio.get_running_loop())
    before = time.monotonic()
    inbox.put(delivery(1, consumer=1))  # a cancelled consumer's, still in the inbox
    for tag in range(2, 6):
        inbox.put(delivery(tag, consumer=2))
    after = time.monotonic()
    arrivals = [d.arrived for d in inbox._items]
    assert before <= arrivals[0] and arrivals == sorted(arrivals) and arrivals[-1] <= after
    assert inbox.first_arrived(2) == arrivals[1]  # consumer 1's delivery is dropped
    assert [d.tag for d in inbox.take(2, 2)] == [2, 3]
    assert inbox.first_arrived(2) == arrivals[3]
    assert inbox.last_arrived() == arrivals[-1]


async def test_a_lost_connection_ends_the_wait_at_once() -> None:
    """`lose` (from the ioloop thread) wakes a receive waiting for deliveries that cannot come."""
    inbox = Inbox(asyncio.get_running_loop())
    error = TransportUnavailable("connection lost")
    threading.Timer(0.1, inbox.lose, [error]).start()
    started = time.monotonic()
    assert not await inbox.wait_for(1, 1, 10.0)
    assert time.monotonic() - started < 5.0  # not the 10 s timeout
    assert inbox.lost is error
