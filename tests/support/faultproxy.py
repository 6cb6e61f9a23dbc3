"""A TCP proxy on 127.0.0.1 that the tests put between the bridge and a service, and tell to
misbehave: network faults made on loopback, without root, namespaces or packet filters.

`FaultProxy(host, port)` listens on a free port of 127.0.0.1 and forwards every connection it
accepts to `host:port`, each direction by a task of its own. From any thread (a test's event
loop or plain code), while a `bridge run` child process talks through it:

- `latency(seconds)`: every chunk is forwarded that much later than it was read (in order;
  the chunks in between keep flowing, so it delays without throttling);
- `blackhole()`: nothing is forwarded in either direction and nothing is closed: no RST, no
  FIN, the sockets stay open and silent, as when a route between the hosts is lost. New
  connections are accepted (the kernel completes the handshake of a listening socket anyway)
  and wait, unconnected upstream, for the network to come back;
- `cut("up")` or `cut("down")`: the same for one direction only (`up`: client to service);
- `heal()`: forwarding resumes in both directions, latency off. What was held is delivered
  then, in order, as TCP would once its retransmissions got through: a blackhole delays a
  stream, it never loses part of it;
- `reset()`: every open connection is reset (SO_LINGER 0, then close: an RST on both sides),
  as a firewall or a restarted middlebox does. Later connections are forwarded as usual;
- `arm(trigger, times, skip)`: a commit whose outcome the client never learns. A proxy made
  with a `wire` (tests/support/wire.py: PostgreSQL, AMQP or Kafka framing) cuts each
  connection's stream into messages; the next `times` client messages the trigger matches (a
  COMMIT, a basic.publish, a Produce request), after `skip` it lets through, are forwarded,
  and so is whatever the client sends after, but from then on nothing of that connection
  comes back: once the service answered (the trigger says which message answers) or after the
  trigger's `hold` seconds, the connection is reset. The service did the work; the client
  sees its connection reset while it waits.
  `trigger.fired` counts the firings.

With `tls` (an `ssl.SSLContext` for a server) the proxy's listener speaks TLS and forwards the
plain bytes: a TLS front for a service that has none of its own (the local Kafka broker).

What it cannot make: a peer whose kernel stops acknowledging. The proxy's kernel acknowledges
whatever reaches it, so TCP keepalives and `TCP_USER_TIMEOUT` of the client never fire while it
blackholes; only the application's own timeouts (heartbeats, call deadlines) can notice.
That is the stall users report (the connection open, the peer silent), and the one the bridge
must notice on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
import threading
import time
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Literal, TypeVar

from tests.support.wire import Framer, Trigger, Wire

__all__ = ["FaultProxy"]

Direction = Literal["up", "down"]
T = TypeVar("T")
CHUNK = 65536


class _Pipe:
    """One accepted connection and its upstream one."""

    def __init__(self, client: asyncio.StreamWriter, wire: Wire | None) -> None:
        self.client = client
        self.server: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.frames: dict[Direction, Framer | None] = {
            "up": wire.up() if wire else None,
            "down": wire.down() if wire and wire.down else None,
        }
        #: The trigger that fired on this connection, and the request it matched.
        self.doomed: tuple[Trigger, bytes] | None = None

    def writers(self) -> list[asyncio.StreamWriter]:
        return [w for w in (self.client, self.server) if w is not None]


class FaultProxy:
    """See the module docstring. A context manager: leaving it closes everything."""

    def __init__(
        self,
        host: str,
        port: int,
        wire: Wire | None = None,
        *,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.target = (host, port)
        self.wire = wire
        self.tls = tls
        self._triggers: list[Trigger] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._flowing: dict[Direction, asyncio.Event] = {}
        self._delay = 0.0
        self._pipes: set[_Pipe] = set()
        self._server: asyncio.Server | None = None
        self.port = 0
        self.accepted = 0

    # ---- control, from any thread

    def start(self) -> FaultProxy:
        self._thread.start()
        self._call(self._start())
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def latency(self, seconds: float) -> None:
        self._loop.call_soon_threadsafe(setattr, self, "_delay", seconds)

    def blackhole(self) -> None:
        self._set(up=False, down=False)

    def cut(self, direction: Direction) -> None:
        self._set(**{direction: False})

    def heal(self) -> None:
        self.latency(0.0)
        self._set(up=True, down=True)

    def reset(self) -> None:
        self._call(self._reset())

    def arm(self, trigger: Trigger, times: int = 1, skip: int = 0) -> Trigger:
        """Fire `trigger` on the next `times` matching client messages, after letting `skip`
        of them through (see the module)."""
        assert trigger.wire == self.wire, f"a {trigger.wire.name} trigger on a {self.wire} proxy"

        def apply() -> None:
            trigger.times = trigger.fired + times
            trigger.skip = skip
            if trigger not in self._triggers:
                self._triggers.append(trigger)

        self._loop.call_soon_threadsafe(apply)
        return trigger

    @property
    def connections(self) -> int:
        """Connections open through the proxy now."""
        return len(self._pipes)

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(30)

    def _set(self, **flowing: bool) -> None:
        def apply() -> None:
            for direction, on in flowing.items():
                event = self._flowing[direction]  # type: ignore[index]
                event.set() if on else event.clear()

        self._loop.call_soon_threadsafe(apply)

    # ---- on the proxy's own loop

    async def _start(self) -> None:
        self._flowing = {"up": asyncio.Event(), "down": asyncio.Event()}
        for event in self._flowing.values():
            event.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        pipe = _Pipe(writer, self.wire)
        self._pipes.add(pipe)
        try:
            # A connection made during a blackhole reaches the service once it is over.
            await self._flowing["up"].wait()
            await self._flowing["down"].wait()
            if writer.is_closing():  # reset while it waited
                return
            try:
                up_reader, pipe.server = await asyncio.open_connection(*self.target)
            except OSError:
                _abort(writer)
                return
            pipe.tasks = [
                asyncio.create_task(self._pump(pipe, reader, pipe.server, "up")),
                asyncio.create_task(self._pump(pipe, up_reader, writer, "down")),
            ]
            await asyncio.gather(*pipe.tasks, return_exceptions=True)
        except asyncio.CancelledError:
            # Closing the proxy: end quietly (asyncio's streams log a cancelled handler).
            _abort(writer)
        finally:
            self._pipes.discard(pipe)
            for w in pipe.writers():
                w.close()

    async def _pump(
        self,
        pipe: _Pipe,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        direction: Direction,
    ) -> None:
        """Forward one direction: read, hold for the latency, wait while cut, write; with a
        wire, look at each message for the triggers."""
        flowing = self._flowing[direction]
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        forward = asyncio.create_task(self._forward(queue, writer, flowing))
        try:
            while True:
                await flowing.wait()  # a cut side reads nothing more either
                try:
                    chunk = await reader.read(CHUNK)
                except OSError:  # reset by its peer: pass the reset on
                    forward.cancel()
                    _abort(writer)
                    return
                if not self._look(pipe, direction, chunk):
                    continue  # a doomed connection's answer: dropped
                queue.put_nowait((time.monotonic() + self._delay, chunk))
                if not chunk:
                    break
            await forward
        finally:
            forward.cancel()

    async def _forward(
        self,
        queue: asyncio.Queue[tuple[float, bytes]],
        writer: asyncio.StreamWriter,
        flowing: asyncio.Event,
    ) -> None:
        while True:
            due, chunk = await queue.get()
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            await flowing.wait()
            try:
                if not chunk:  # the other side's FIN, passed on as a half close
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(chunk)
                await writer.drain()
            except OSError:
                return

    def _look(self, pipe: _Pipe, direction: Direction, chunk: bytes) -> bool:
        """Whether to forward `chunk`: fire a trigger on what the client sends, drop what the
        service sends once one fired, and reset the connection when the service answered."""
        framer = pipe.frames[direction]
        if framer is None and pipe.doomed is None:
            return True
        messages = framer.feed(chunk) if framer is not None and chunk else []
        if direction == "up":
            if pipe.doomed is None:
                for message in messages:
                    trigger = next(
                        (t for t in self._triggers if t.armed and t.request(message)), None
                    )
                    if trigger is not None and trigger.skip:
                        trigger.skip -= 1
                    elif trigger is not None:
                        self._fire(pipe, trigger, message)
                        break
            return True
        if pipe.doomed is None:
            return True
        trigger, request = pipe.doomed
        if not chunk or trigger.answer is None or any(trigger.answer(request, m) for m in messages):
            self._reset_pipe(pipe)
        return False

    def _fire(self, pipe: _Pipe, trigger: Trigger, request: bytes) -> None:
        trigger.fired += 1
        trigger.fired_at.append(time.monotonic())
        pipe.doomed = (trigger, request)
        self._loop.call_later(trigger.hold, self._reset_pipe, pipe)

    def _reset_pipe(self, pipe: _Pipe) -> None:
        for task in pipe.tasks:
            task.cancel()
        for writer in pipe.writers():
            _abort(writer)

    async def _reset(self) -> None:
        for pipe in list(self._pipes):
            self._reset_pipe(pipe)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._reset()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with an RST rather than a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
