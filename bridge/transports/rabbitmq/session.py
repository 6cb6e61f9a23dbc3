"""One SelectConnection and its channel, run on a daemon thread of its own (see `connection.py`).

Everything pika is touched on that thread only: the event loop hands work over with
`submit` (`ioloop.add_callback_threadsafe`), the ioloop settles each call's `Done`, which
posts the result back with `loop.call_soon_threadsafe`. A channel the broker closes fails the
calls running on it and is replaced on the same connection; a lost connection fails every call
and ends the thread, and, when it had been open and its owner did not close it, is reported to
`on_lost` (on the ioloop thread): a consumer waiting for deliveries has no call to fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pika
from pika.adapters.select_connection import SelectConnection

from bridge.errors import BridgeError, TransportUnavailable
from bridge.transports.rabbitmq.coalesce_writes import coalesce_writes
from bridge.transports.rabbitmq.confirms import Confirms, Message, Routes
from bridge.transports.rabbitmq.errors import translate
from bridge.transports.rabbitmq.handoff import Calls, Done, Op

__all__ = ["Session"]

log = logging.getLogger("bridge.rabbitmq")

_EPOCHS = itertools.count(1)


class Session:
    """One SelectConnection and its thread. `closed` and `close_error` are shared under
    `calls.lock`, `epoch` is read from the event loop; the `_` attributes are the ioloop's."""

    def __init__(
        self,
        params: pika.URLParameters,
        where: str,
        confirm: bool,
        loop: asyncio.AbstractEventLoop,
        on_lost: Callable[[BridgeError], None] | None = None,
    ) -> None:
        self.params = params
        self.where = where
        self.confirm = confirm
        self.loop = loop
        self.calls = Calls()
        self.closed = False
        self.close_error: BridgeError = TransportUnavailable(f"{where}: connection closed")
        self.epoch = 0
        self.ready = Done(self.calls, loop)
        # Its owner stops waiting after `connect_timeout`; a failure after that is nobody's.
        self.ready.future.add_done_callback(_retrieved)
        self._on_lost = on_lost
        self._was_open = False
        self.confirms = Confirms(where)
        self._connection: SelectConnection | None = None
        self._channel: pika.channel.Channel | None = None
        self._waiting: list[tuple[Op, Done]] = []
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=f"bridge-amqp {where}", daemon=True)

    # -- from the event loop ----------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, op: Op) -> asyncio.Future[Any]:
        done = Done(self.calls, self.loop)
        with self.calls.lock:
            if self.closed:
                error: BridgeError | None = self.close_error
            else:
                error = None
                self.calls.outstanding.add(done)
        if error is not None:
            done.fail(error)
        elif not self._call_soon(lambda: self._begin(op, done)):
            done.fail(self.close_error)
        return done.future

    def shutdown(self) -> None:
        self._closing = True
        self._call_soon(self._close_connection)

    async def stopped(self, timeout: float) -> None:
        await asyncio.to_thread(self._thread.join, timeout)

    def _call_soon(self, callback: Callable[[], None]) -> bool:
        connection = self._connection
        if connection is None:
            return False
        try:
            connection.ioloop.add_callback_threadsafe(callback)
        except Exception:  # the ioloop is already closed
            return False
        return True

    # -- on the ioloop thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._connection = SelectConnection(
                self.params,
                on_open_callback=self._on_connection_open,
                on_open_error_callback=self._on_connection_closed,
                on_close_callback=self._on_connection_closed,
            )
            self._connection.ioloop.start()
        except Exception as exc:  # pika failed outside a callback: treat as a lost connection
            self._fail_everything(translate(exc, self.where))
        finally:
            with contextlib.suppress(Exception):
                if self._connection is not None:
                    self._connection.ioloop.close()

    def _on_connection_open(self, connection: SelectConnection) -> None:
        if self._closing:  # closed by its owner while it was connecting
            connection.close()
        else:
            self._open_channel()

    def _open_channel(self) -> None:
        assert self._connection is not None
        self._connection.channel(on_open_callback=self._on_channel_open)

    def _on_channel_open(self, channel: pika.channel.Channel) -> None:
        channel.add_on_close_callback(self._on_channel_closed)
        if self.confirm:
            channel.add_on_return_callback(self.confirms.on_return)
            channel.confirm_delivery(
                self.confirms.on_confirm, callback=lambda _: self._ready(channel)
            )
        else:
            self._ready(channel)

    def _ready(self, channel: pika.channel.Channel) -> None:
        self._channel = channel
        self.confirms.channel_ready()
        self.epoch = next(_EPOCHS)
        self._was_open = True
        self.ready.ok(None)
        waiting, self._waiting = self._waiting, []
        for op, done in waiting:
            self._begin(op, done)

    def _begin(self, op: Op, done: Done) -> None:
        if done.settled:
            return
        channel = self._channel
        if channel is None or not channel.is_open:
            self._waiting.append((op, done))
            return
        self.calls.running.add(done)
        try:
            op(channel, self.epoch, done)
        except Exception as exc:
            done.fail(translate(exc, self.where))

    def _on_channel_closed(self, channel: pika.channel.Channel, reason: BaseException) -> None:
        if channel is not self._channel:
            return
        self._channel = None
        self.epoch = 0
        error = translate(reason, self.where)
        self.confirms.channel_lost(reason, error)
        for done in list(self.calls.running):
            done.fail(error)
        connection = self._connection
        if connection is not None and connection.is_open and not self._closing:
            log.info("%s: channel closed (%s); opening a new one", self.where, error)
            self._open_channel()

    def _on_connection_closed(self, connection: SelectConnection, reason: BaseException) -> None:
        error = translate(reason, self.where)
        self._fail_everything(error)
        if self._was_open and not self._closing and self._on_lost is not None:
            try:
                self._on_lost(error)
            except Exception:  # the owner's hook must not keep the thread from ending
                log.exception("%s: reporting the lost connection failed", self.where)
        connection.ioloop.stop()

    def _fail_everything(self, error: BridgeError) -> None:
        with self.calls.lock:
            self.closed = True
            self.close_error = error
            pending = list(self.calls.outstanding)
        self._channel = None
        self.confirms.forget()
        self.ready.fail(error)
        for done in pending:
            done.fail(error)

    def _close_connection(self) -> None:
        connection = self._connection
        if connection is None:
            return
        if connection.is_closed:
            connection.ioloop.stop()
        elif not connection.is_closing:
            try:
                connection.close()
            except Exception:  # closing while the connection workflow is still running
                self._fail_everything(self.close_error)
                connection.ioloop.stop()

    def publish(
        self,
        channel: pika.channel.Channel,
        done: Done,
        exchange: str,
        routing_key: str,
        messages: Sequence[Message],
        routes: Routes = None,
        mandatory: bool = True,
    ) -> None:
        """On the ioloop thread: publish `messages` with confirms (see `confirms.py`)."""
        if self.confirms.publish(channel, done, exchange, routing_key, messages, routes, mandatory):
            coalesce_writes(self._connection)


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
