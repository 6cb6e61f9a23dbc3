"""One AMQP connection and its channel, run by pika's SelectConnection on a thread of its own.

Why a thread: pika is not asyncio code, and its blocking adapter waits for each publisher
confirm before the next publish. A SelectConnection is asynchronous (many messages in flight,
confirms counted as they come), so each `Link` (one per source, sink and transport) runs one
SelectConnection's ioloop on a dedicated daemon thread. Everything pika is touched on that
thread only: the event loop hands work over with `ioloop.add_callback_threadsafe`, the ioloop
hands results back by settling asyncio futures with `loop.call_soon_threadsafe`.

Channels: a link has one channel at a time. When the broker closes it (404, 406, ...), the work
running on it fails with the translated error and a new channel is opened on the same
connection; `epoch` (unique per channel, process-wide) tells delivery tags of different channels
apart, so a tag is never acknowledged on a channel that did not deliver it.

Reconnect: when the connection fails, every call in progress fails with `TransportUnavailable`
and the thread ends; the next call opens a new connection (and thread). Every call has a
deadline; one that passes it closes the connection, since its state is then unknown.

Publishing: with `confirm=True` the channel is in confirm mode; `publish` writes a whole list
of messages with `mandatory=True` and completes once the broker has confirmed every one,
reporting which came back unroutable (`basic.return`, matched to their index by `message_id`
in publish order) and how many were nacked. The frames of one `publish` are joined into writes
of up to 128 KiB (`_coalesce_writes`) rather than one send() per frame.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pika
from pika import spec
from pika.adapters.select_connection import SelectConnection

from bridge.errors import (
    BridgeError,
    ConfigError,
    MessageRejected,
    TransportError,
    TransportUnavailable,
)
from bridge.transports.rabbitmq.config import (
    BLOCKED_TIMEOUT,
    CONNECT_TIMEOUT,
    OPERATION_TIMEOUT,
    RabbitMQConnection,
    describe,
    lint,
)
from bridge.transports.rabbitmq.errors import oversized_body, translate

__all__ = ["Done", "Link", "Message", "Op", "PublishOutcome", "parameters"]

log = logging.getLogger("bridge.rabbitmq")

_EPOCHS = itertools.count(1)
_WRITE_CHUNK = 128 * 1024

Message = tuple[pika.BasicProperties, bytes]


def parameters(config: RabbitMQConnection, name: str, role: str) -> pika.URLParameters:
    """pika parameters for one connection of `name` used as `role` (source, sink, admin)."""
    for _, problem in lint(config):
        raise ConfigError(f"{describe(name)}: {problem}")
    split = urlsplit(config.url)
    try:
        params = pika.URLParameters(config.url)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{describe(name)}: invalid url: {exc}") from None
    given = parse_qs(split.query)
    if "connection_attempts" not in given:
        params.connection_attempts = 1
    if "blocked_connection_timeout" not in given:
        params.blocked_connection_timeout = BLOCKED_TIMEOUT
    if "client_properties" not in given:
        params.client_properties = {"connection_name": f"bridge {name} {role}"}
    return params


@dataclass(slots=True)
class PublishOutcome:
    """What the broker said about one `publish`: returned indexes, nack count, reply text."""

    returned: list[int] = field(default_factory=list)
    nacked: int = 0
    return_text: str = ""


class Done:
    """Settles one asyncio future from any thread, once."""

    __slots__ = ("_loop", "_session", "future", "settled")

    def __init__(self, session: _Session, loop: asyncio.AbstractEventLoop) -> None:
        self._session = session
        self._loop = loop
        self.future: asyncio.Future[Any] = loop.create_future()
        self.settled = False

    def ok(self, value: Any = None) -> None:
        if self._finish():
            self._post(self._set_result, value)

    def fail(self, error: BaseException) -> None:
        if self._finish():
            self._post(self._set_exception, error)

    def _finish(self) -> bool:
        with self._session.lock:
            if self.settled:
                return False
            self.settled = True
            self._session.outstanding.discard(self)
        self._session.running.discard(self)
        return True

    def _post(self, setter: Callable[[Any], None], value: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody waits
            self._loop.call_soon_threadsafe(setter, value)

    def _set_result(self, value: Any) -> None:
        if not self.future.done():
            self.future.set_result(value)

    def _set_exception(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


Op = Callable[[pika.channel.Channel, int, Done], None]


class _Publish:
    """One `publish` in flight: counts confirms, matches returns to indexes."""

    def __init__(self, done: Done, messages: Sequence[Message]) -> None:
        self.done = done
        self.ids = [properties.message_id for properties, _ in messages]
        self.sizes = [len(body) for _, body in messages]
        self.unconfirmed: set[int] = set()
        self.outcome = PublishOutcome()
        self._scan = 0

    def match_return(self, message_id: str | None, text: str) -> bool:
        for index in range(self._scan, len(self.ids)):
            if self.ids[index] == message_id and index in self.unconfirmed:
                self._scan = index + 1
                self.outcome.returned.append(index)
                self.outcome.return_text = text
                return True
        return False

    def confirmed(self, index: int, nack: bool) -> None:
        self.unconfirmed.discard(index)
        if nack:
            self.outcome.nacked += 1
        if not self.unconfirmed:
            self.done.ok(self.outcome)

    def channel_lost(self, reason: BaseException, error: BridgeError) -> None:
        size = oversized_body(reason)
        if size is not None and self.unconfirmed:
            pending = sorted(self.unconfirmed)
            index = next((i for i in pending if self.sizes[i] == size), None)
            if index is None:
                index = max(pending, key=lambda i: self.sizes[i])
            error = MessageRejected(str(error), index=index)
        self.done.fail(error)


class _Session:
    """One SelectConnection and its thread. Attributes below `lock` are the ioloop's own."""

    def __init__(
        self,
        params: pika.URLParameters,
        where: str,
        confirm: bool,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.params = params
        self.where = where
        self.confirm = confirm
        self.loop = loop
        self.lock = threading.Lock()
        self.closed = False
        self.close_error: BridgeError = TransportUnavailable(f"{where}: connection closed")
        self.outstanding: set[Done] = set()
        self.running: set[Done] = set()
        self.epoch = 0
        self.ready = Done(self, loop)
        self._connection: SelectConnection | None = None
        self._channel: pika.channel.Channel | None = None
        self._waiting: list[tuple[Op, Done]] = []
        self._publishes: list[_Publish] = []
        self._unconfirmed: dict[int, tuple[_Publish, int]] = {}
        self._next_tag = 1
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=f"bridge-amqp {where}", daemon=True)

    # -- from the event loop ----------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, op: Op) -> asyncio.Future[Any]:
        done = Done(self, self.loop)
        with self.lock:
            if self.closed:
                error: BridgeError | None = self.close_error
            else:
                error = None
                self.outstanding.add(done)
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
            channel.add_on_return_callback(self._on_return)
            channel.confirm_delivery(self._on_confirm, callback=lambda _: self._ready(channel))
        else:
            self._ready(channel)

    def _ready(self, channel: pika.channel.Channel) -> None:
        self._channel = channel
        self._next_tag = 1
        self.epoch = next(_EPOCHS)
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
        self.running.add(done)
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
        publishes, self._publishes = self._publishes, []
        self._unconfirmed.clear()
        for publish in publishes:
            publish.channel_lost(reason, error)
        for done in list(self.running):
            done.fail(error)
        connection = self._connection
        if connection is not None and connection.is_open and not self._closing:
            log.info("%s: channel closed (%s); opening a new one", self.where, error)
            self._open_channel()

    def _on_connection_closed(self, connection: SelectConnection, reason: BaseException) -> None:
        self._fail_everything(translate(reason, self.where))
        connection.ioloop.stop()

    def _fail_everything(self, error: BridgeError) -> None:
        with self.lock:
            self.closed = True
            self.close_error = error
            pending = list(self.outstanding)
        self._channel = None
        self._publishes = []
        self._unconfirmed.clear()
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

    # -- publisher confirms -----------------------------------------------------------------

    def publish(
        self,
        channel: pika.channel.Channel,
        done: Done,
        exchange: str,
        routing_key: str,
        messages: Sequence[Message],
    ) -> None:
        state = _Publish(done, messages)
        if not messages:
            done.ok(state.outcome)
            return
        self._publishes.append(state)
        for index, (properties, body) in enumerate(messages):
            try:
                channel.basic_publish(exchange, routing_key, body, properties, mandatory=True)
            except Exception as exc:  # nothing of this message went out (pika marshals first)
                self._publishes.remove(state)
                done.fail(translate(exc, self.where, index=index))
                return
            self._unconfirmed[self._next_tag] = (state, index)
            state.unconfirmed.add(index)
            self._next_tag += 1
        _coalesce_writes(self._connection)

    def _on_confirm(self, frame: pika.frame.Method) -> None:
        method = frame.method
        nack = isinstance(method, spec.Basic.Nack)
        tags: list[int]
        if method.multiple:
            tags = list(itertools.takewhile(lambda t: t <= method.delivery_tag, self._unconfirmed))
        else:
            tags = [method.delivery_tag]
        for tag in tags:
            entry = self._unconfirmed.pop(tag, None)
            if entry is None:
                continue
            state, index = entry
            state.confirmed(index, nack)
            if not state.unconfirmed and state in self._publishes:
                self._publishes.remove(state)

    def _on_return(
        self,
        channel: pika.channel.Channel,
        method: spec.Basic.Return,
        properties: pika.BasicProperties,
        body: bytes,
    ) -> None:
        text = f"({method.reply_code}) {method.reply_text}"
        for state in self._publishes:
            if state.match_return(properties.message_id, text):
                return
        log.warning("%s: a returned message matched no publish in flight", self.where)


def _coalesce_writes(connection: SelectConnection | None) -> None:
    """Join the frames pika buffered for the socket into writes of up to `_WRITE_CHUNK` bytes.

    pika sends each buffered frame with a send() of its own once the socket is writable: three
    per message (method, header, body), each a TCP segment for the kernel and the broker. The
    same bytes in fewer buffers go out in fewer sends; the cap keeps the copy that pika makes
    of a partly sent buffer's rest small. This reaches into pika's transport
    (`_transport._tx_buffers`, pika 1.x); should that change, it does nothing and every frame
    goes out as before.
    """
    buffers = getattr(getattr(connection, "_transport", None), "_tx_buffers", None)
    if not isinstance(buffers, collections.deque) or len(buffers) < 2:
        return
    chunks: list[bytes] = []
    run: list[bytes] = []
    size = 0
    for buffer in buffers:
        if run and size + len(buffer) > _WRITE_CHUNK:
            chunks.append(b"".join(run))
            run, size = [], 0
        run.append(buffer)
        size += len(buffer)
    chunks.append(b"".join(run))
    buffers.clear()
    buffers.extend(chunks)


class Link:
    """A connection used by one source, sink or transport; reconnects on the next call."""

    def __init__(self, params: pika.URLParameters, where: str, *, confirm: bool = False) -> None:
        self._params = params
        self.where = where
        self._confirm = confirm
        self._session: _Session | None = None
        self._opening = asyncio.Lock()
        self._closed = False
        self._finalizer: weakref.finalize[[], Link] | None = None

    @property
    def epoch(self) -> int:
        """The current channel's epoch (0 when there is none)."""
        session = self._session
        return 0 if session is None or session.closed else session.epoch

    @property
    def frame_max(self) -> int:
        return int(self._params.frame_max)

    async def _open(self) -> _Session:
        if self._closed:
            raise TransportError(f"{self.where}: used after close()")
        async with self._opening:
            session = self._session
            if session is None or session.closed:
                session = _Session(
                    self._params, self.where, self._confirm, asyncio.get_running_loop()
                )
                self._session = session
                session.start()
                if self._finalizer is not None:
                    self._finalizer.detach()
                # A link dropped without close() must not leave its connection and thread behind.
                self._finalizer = weakref.finalize(self, session.shutdown)
            try:
                await self._wait(
                    session, asyncio.shield(session.ready.future), CONNECT_TIMEOUT, "connect"
                )
            except BridgeError:
                if self._session is session:
                    self._session = None
                raise
            return session

    async def _wait(
        self, session: _Session, future: asyncio.Future[Any], timeout: float, what: str
    ) -> Any:
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            session.shutdown()
            if self._session is session:
                self._session = None  # the next call connects anew
            raise TransportUnavailable(
                f"{self.where}: no answer to {what} within {timeout:.0f}s; reconnecting"
            ) from None

    async def run(self, op: Op, *, what: str, timeout: float = OPERATION_TIMEOUT) -> Any:
        """Run `op(channel, epoch, done)` on the ioloop thread; it settles `done` when finished."""
        session = await self._open()
        return await self._wait(session, session.submit(op), timeout, what)

    async def publish(
        self,
        exchange: str,
        routing_key: str,
        messages: Sequence[Message],
        *,
        timeout: float,
    ) -> PublishOutcome:
        if not self._confirm:
            raise TypeError("publish needs a link opened with confirm=True")
        session = await self._open()

        def op(channel: pika.channel.Channel, epoch: int, done: Done) -> None:
            session.publish(channel, done, exchange, routing_key, messages)

        outcome: PublishOutcome = await self._wait(
            session, session.submit(op), timeout, f"publish of {len(messages)} messages"
        )
        return outcome

    async def close(self) -> None:
        """Close the connection (unacknowledged deliveries go back to their queue); idempotent."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            session.shutdown()
            await session.stopped(CONNECT_TIMEOUT)
