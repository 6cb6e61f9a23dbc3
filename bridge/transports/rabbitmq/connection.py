"""One AMQP connection and its channel, run by pika's SelectConnection on a thread of its own.

Why a thread: pika is not asyncio code, and its blocking adapter waits for each publisher
confirm before the next publish. A SelectConnection is asynchronous (many messages in flight,
confirms counted as they come), so each `Link` (one per source, sink and transport) runs one
SelectConnection's ioloop on a dedicated daemon thread (`session.py`). Everything pika is
touched on that thread only: the event loop hands work over with
`ioloop.add_callback_threadsafe`, the ioloop hands results back by settling asyncio futures
with `loop.call_soon_threadsafe` (`handoff.py`).

Channels: a link has one channel at a time. When the broker closes it (404, 406, ...), the work
running on it fails with the translated error and a new channel is opened on the same
connection; `epoch` (unique per channel, process-wide) tells delivery tags of different channels
apart, so a tag is never acknowledged on a channel that did not deliver it.

Reconnect: when the connection fails, every call in progress fails with `TransportUnavailable`
and the thread ends; the next call opens a new connection (and thread). An open connection that
is lost without its owner closing it is also reported to the link's `on_lost` (a source's
consumer waits for deliveries, not for a call, so nothing else would tell it). Every call has a
deadline; one that passes it closes the connection, since its state is then unknown.

Publishing: with `confirm=True` the channel is in confirm mode; `publish` writes a whole list
of messages with `mandatory=True` and completes once the broker has confirmed every one,
reporting which came back unroutable (`basic.return`, matched to their index by `message_id`
in publish order) and how many were nacked (`confirms.py`). The frames of one `publish` are
joined into writes of up to 128 KiB (`coalesce_writes.py`) rather than one send() per frame.

Parameters: `parameters` makes pika's from the connection's URL and settings (see `config.py`);
`link` makes a Link with the connection's timeouts.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pika

from bridge.errors import BridgeError, ConfigError, TransportError, TransportUnavailable
from bridge.transports.rabbitmq.config import (
    CONFIRM_TIMEOUT,
    CONNECT_TIMEOUT,
    OPERATION_TIMEOUT,
    RabbitMQConnection,
    describe,
    lint,
)
from bridge.transports.rabbitmq.confirms import Message, PublishOutcome, Routes
from bridge.transports.rabbitmq.handoff import Done, Op
from bridge.transports.rabbitmq.session import Session

__all__ = ["Link", "link", "parameters"]


def parameters(config: RabbitMQConnection, name: str, role: str) -> pika.URLParameters:
    """pika parameters for one connection of `name` used as `role` (source, sink, admin)."""
    for _, problem in lint(config):
        raise ConfigError(f"{describe(name)}: {problem}")
    split = urlsplit(config.url)
    try:
        params = pika.URLParameters(config.url)
    except OSError as exc:  # ssl_options naming certificate files that cannot be loaded
        raise ConfigError(f"{describe(name)}: url ssl_options: {exc}") from None
    except (ValueError, TypeError, SyntaxError) as exc:  # what `lint` did not foresee
        raise ConfigError(f"{describe(name)}: invalid url: {exc}") from None
    given = parse_qs(split.query)
    if "connection_attempts" not in given:
        params.connection_attempts = 1
    if "heartbeat" not in given:
        params.heartbeat = config.heartbeat
    if "blocked_connection_timeout" not in given:
        params.blocked_connection_timeout = config.blocked_timeout
    if "client_properties" not in given:
        params.client_properties = {"connection_name": f"bridge {name} {role}"}
    return params


def link(
    config: RabbitMQConnection,
    name: str,
    role: str,
    where: str,
    *,
    confirm: bool = False,
    on_lost: Callable[[BridgeError], None] | None = None,
) -> Link:
    """A `Link` of connection `name` used as `role`, with the connection's timeouts."""
    return Link(
        parameters(config, name, role),
        where,
        confirm=confirm,
        on_lost=on_lost,
        connect_timeout=config.connect_timeout,
        operation_timeout=config.operation_timeout,
        confirm_timeout=config.confirm_timeout,
    )


class Link:
    """A connection used by one source, sink or transport; reconnects on the next call."""

    def __init__(
        self,
        params: pika.URLParameters,
        where: str,
        *,
        confirm: bool = False,
        connect_timeout: float = CONNECT_TIMEOUT,
        operation_timeout: float = OPERATION_TIMEOUT,
        confirm_timeout: float = CONFIRM_TIMEOUT,
        on_lost: Callable[[BridgeError], None] | None = None,
    ) -> None:
        self._params = params
        self._on_lost = on_lost  # told on the ioloop thread when an open connection is lost
        self.where = where
        self._confirm = confirm
        self.connect_timeout = connect_timeout
        self.operation_timeout = operation_timeout
        self.confirm_timeout = confirm_timeout
        self._session: Session | None = None
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

    async def _open(self) -> Session:
        if self._closed:
            raise TransportError(f"{self.where}: used after close()")
        async with self._opening:
            session = self._session
            if session is None or session.closed:
                session = Session(
                    self._params,
                    self.where,
                    self._confirm,
                    asyncio.get_running_loop(),
                    self._on_lost,
                )
                self._session = session
                session.start()
                if self._finalizer is not None:
                    self._finalizer.detach()
                # A link dropped without close() must not leave its connection and thread behind.
                self._finalizer = weakref.finalize(self, session.shutdown)
            try:
                await self._wait(
                    session,
                    asyncio.shield(session.ready.future),
                    self.connect_timeout,
                    "connect",
                )
            except BridgeError:
                if self._session is session:
                    self._session = None
                raise
            return session

    async def _wait(
        self, session: Session, future: asyncio.Future[Any], timeout: float, what: str
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

    async def run(self, op: Op, *, what: str, timeout: float | None = None) -> Any:
        """Run `op(channel, epoch, done)` on the ioloop thread; it settles `done` when finished,
        within `timeout` (default `operation_timeout`)."""
        session = await self._open()
        deadline = self.operation_timeout if timeout is None else timeout
        return await self._wait(session, session.submit(op), deadline, what)

    async def publish(
        self,
        exchange: str,
        routing_key: str,
        messages: Sequence[Message],
        *,
        timeout: float | None = None,
        routes: Routes = None,
        mandatory: bool = True,
    ) -> PublishOutcome:
        """Publish `messages`; their confirms within `timeout` (default `confirm_timeout`).
        `mandatory=False` (a publish of events): a message no queue takes is dropped, not
        returned."""
        if not self._confirm:
            raise TypeError("publish needs a link opened with confirm=True")
        session = await self._open()

        def op(channel: pika.channel.Channel, epoch: int, done: Done) -> None:
            session.publish(channel, done, exchange, routing_key, messages, routes, mandatory)

        deadline = self.confirm_timeout if timeout is None else timeout
        outcome: PublishOutcome = await self._wait(
            session, session.submit(op), deadline, f"publish of {len(messages)} messages"
        )
        return outcome

    async def close(self) -> None:
        """Close the connection (unacknowledged deliveries go back to their queue); idempotent."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            session.shutdown()
            await session.stopped(self.connect_timeout)
