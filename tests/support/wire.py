"""Just enough of three wire protocols for the fault proxy to find one client message in a TCP
stream and the service's answer to it: the "commits" whose answer a test throws away
(`FaultProxy.arm`, tests/support/faultproxy.py).

A `Wire` cuts each direction of a connection into whole messages (a chunk read from a socket
may hold part of one, or several); a `Trigger` says which client message to cut after and which
service message answers it. Nothing else of a protocol is read:

- PostgreSQL (protocol 3): the client opens with untyped messages (int32 length including
  itself, int32 code: an SSLRequest or GSSENCRequest, answered by one byte, then the startup
  message); every later message is a type byte and an int32 length that counts itself but not
  the type. psycopg 3 commits with a simple query, `Q`, length 11, `COMMIT\\0` (seen through
  this proxy: `Connection.commit()` sends nothing else). The server's answers are not parsed:
  whatever it sends after a COMMIT is the answer (the protocol is one request at a time). The
  connection must not be encrypted (`sslmode=disable`), or nothing can be read.
- AMQP 0-9-1: the client opens with the 8-byte protocol header `AMQP\\0\\0\\x09\\x01`; then
  both sides send frames: type (1 = method), channel (int16), size (int32), payload, 0xCE. A
  method frame's payload begins with its class id and method id (int16 each): basic.publish is
  60/40, basic.ack 60/80 (the client's acknowledgement of a delivery, or the broker's publisher
  confirm), basic.nack 60/120.
- Kafka: every request and response is an int32 size and that many bytes; a request begins
  with api_key (int16), api_version (int16), correlation_id (int32), a response with the
  correlation_id. Produce is api key 0, OffsetCommit 8.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "AMQP",
    "KAFKA",
    "POSTGRES",
    "Framer",
    "Trigger",
    "Wire",
    "amqp_ack",
    "amqp_publish",
    "kafka_request",
    "postgres_commit",
]


class Framer(Protocol):
    def feed(self, chunk: bytes) -> list[bytes]:
        """The messages `chunk` completes, each whole (headers included), in order."""
        ...


class _Sized:
    """Messages of `head` bytes whose int32 at `at` gives the rest's size, plus `extra`."""

    def __init__(self, head: int, at: int, extra: int, skip: int = 0) -> None:
        self._head, self._at, self._extra, self._skip = head, at, extra, skip
        self._buffer = b""

    def _size(self, buffer: bytes) -> int:
        (n,) = struct.unpack_from(">i", buffer, self._at)
        return self._head + int(n) + self._extra

    def feed(self, chunk: bytes) -> list[bytes]:
        buffer = self._buffer + chunk
        if self._skip:  # a protocol header that is no message
            taken = min(self._skip, len(buffer))
            buffer, self._skip = buffer[taken:], self._skip - taken
        messages = []
        while len(buffer) >= self._head and len(buffer) >= (size := self._size(buffer)):
            messages.append(buffer[:size])
            buffer = buffer[size:]
        self._buffer = buffer
        return messages


#: Startup codes after which the client sends another untyped message.
_PRE_STARTUP = {80877103, 80877104}  # SSLRequest, GSSENCRequest


class _PostgresClient(_Sized):
    def __init__(self) -> None:
        super().__init__(head=5, at=1, extra=-4)  # the length counts itself, not the type
        self._startup = True

    def feed(self, chunk: bytes) -> list[bytes]:
        if not self._startup:
            return super().feed(chunk)
        self._buffer += chunk
        messages: list[bytes] = []
        while self._startup and len(self._buffer) >= 8:  # untyped: length, code
            size, code = struct.unpack_from(">ii", self._buffer)
            if len(self._buffer) < size:
                return messages
            messages.append(self._buffer[:size])
            self._buffer = self._buffer[size:]
            self._startup = code in _PRE_STARTUP  # the startup message: typed from here on
        if self._startup:
            return messages
        rest, self._buffer = self._buffer, b""
        return messages + super().feed(rest)


@dataclass(frozen=True)
class Wire:
    """How to cut a connection of one protocol into messages: `up` client to service, `down`
    service to client (None: not cut; any bytes answer)."""

    name: str
    up: Callable[[], Framer]
    down: Callable[[], Framer] | None


def _amqp(skip: int) -> Framer:
    # type, channel, size, payload, frame end
    return _Sized(head=7, at=3, extra=1, skip=skip)


POSTGRES = Wire("postgresql", _PostgresClient, None)
AMQP = Wire("amqp", lambda: _amqp(8), lambda: _amqp(0))
KAFKA = Wire("kafka", lambda: _Sized(4, 0, 0), lambda: _Sized(4, 0, 0))


@dataclass(eq=False)
class Trigger:
    """What to cut after: a client message `request` matches is forwarded, then everything the
    service sends is dropped, and the connection is reset once the service answered (`answer`
    of the request and a service message; None: its first bytes) or after `hold` seconds,
    whichever comes first. It fires while `fired < times` (see `FaultProxy.arm`)."""

    wire: Wire
    request: Callable[[bytes], bool]
    answer: Callable[[bytes, bytes], bool] | None = None
    hold: float = 2.0
    times: int = 0
    skip: int = 0  # matching messages still to let through before it fires
    fired: int = 0
    #: time.monotonic() of each firing
    fired_at: list[float] = field(default_factory=list)

    @property
    def armed(self) -> bool:
        return self.fired < self.times


_COMMIT = b"Q" + struct.pack(">i", 11) + b"COMMIT\x00"


def postgres_commit() -> Trigger:
    """A transaction's COMMIT: the server commits, the client never learns it did."""
    return Trigger(POSTGRES, lambda message: message == _COMMIT)


def _amqp_method(frame: bytes) -> tuple[int, int] | None:
    if frame[0] != 1 or len(frame) < 11:
        return None
    class_id, method_id = struct.unpack_from(">HH", frame, 7)
    return class_id, method_id


def amqp_publish(exchange: str) -> Trigger:
    """A basic.publish naming `exchange` (or routing key): the rest the client sends still goes
    up, so the batch's messages reach the broker; its publisher confirms never come back."""
    name = exchange.encode()

    def request(frame: bytes) -> bool:
        return _amqp_method(frame) == (60, 40) and name in frame

    def answer(_: bytes, frame: bytes) -> bool:
        return _amqp_method(frame) in ((60, 80), (60, 120))

    return Trigger(AMQP, request, answer)


def amqp_ack(hold: float = 0.5) -> Trigger:
    """A consumer's basic.ack: it has no answer, so the connection is reset after `hold`
    seconds (the broker has read it by then), deliveries sent meanwhile dropped."""
    return Trigger(AMQP, lambda frame: _amqp_method(frame) == (60, 80), lambda _, __: False, hold)


def kafka_request(api_key: int, containing: str) -> Trigger:
    """A request of `api_key` whose bytes contain `containing` (a topic or group name)."""
    name = containing.encode()

    def request(message: bytes) -> bool:
        return struct.unpack_from(">h", message, 4)[0] == api_key and name in message

    def answer(request: bytes, response: bytes) -> bool:
        return response[4:8] == request[8:12]  # the correlation id

    return Trigger(KAFKA, request, answer)
