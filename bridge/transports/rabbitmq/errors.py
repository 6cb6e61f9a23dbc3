"""pika failures translated into the bridge's error tree, in this one place.

Retriable (`TransportUnavailable`): the broker cannot be reached or the connection broke
(`AMQPConnectionError` and its subclasses, pika's connection-workflow failures: refused, name
not resolved, `StreamLostError`, heartbeat timeout,
blocked too long, `ConnectionClosed` with 320 CONNECTION_FORCED on a broker shutdown), a channel
or connection found closed under us (`ChannelWrongStateError`, `ConnectionWrongStateError`),
`OSError`/`TimeoutError`, and the reply codes that describe a passing condition: 320
CONNECTION_FORCED, 405 RESOURCE_LOCKED, 504 CHANNEL_ERROR, 506 RESOURCE_ERROR, 541
INTERNAL_ERROR.

Refused (`AccessRefused`, not retriable): a refused login (`ProbableAuthenticationError`:
403 ACCESS_REFUSED to a wrong password or an unknown user, `AuthenticationError`), a vhost that
does not exist or that the user may not use (`ProbableAccessDeniedError`, or the connection
closed with 530 NOT_ALLOWED), and 403 ACCESS_REFUSED on a channel (no configure, write or read
permission on a queue or exchange). An `amqps://` connection whose broker certificate does not
verify (`ssl.SSLCertVerificationError` inside pika's connection-workflow failure: not signed
by the CAs the connection trusts, or for another host name than the URL's) is `TlsRefused`:
pika never retries without verification, and neither does the bridge.

Not retriable (`TransportError`): 404 NOT_FOUND (a queue or exchange is missing: run `bridge
install`), 406 PRECONDITION_FAILED (a queue exists with other arguments), and the other
protocol errors.

One message refused for good (`MessageRejected`, only when the caller names its index): a
property or header name longer than AMQP's 255-byte short strings, a field value AMQP cannot
encode, or a body over the broker's `max_message_size` (406 "message size ... larger than
configured max size", see `oversized_body`).

Messages name the connection (`rabbitmq connection 'rabbit'`), never its URL: URLs carry
passwords. Errors that already are bridge errors pass through unchanged.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Iterator
from contextlib import contextmanager

from pika import exceptions as amqp
from pika.adapters.utils.connection_workflow import AMQPConnectorException

from bridge.errors import (
    AccessRefused,
    BridgeError,
    MessageRejected,
    TlsRefused,
    TransportError,
    TransportUnavailable,
)

__all__ = [
    "DRIVER_ERRORS",
    "RETRIABLE_CODES",
    "oversized_body",
    "reply_code",
    "translate",
    "translated",
]

#: AMQP reply codes for conditions that go away on their own.
RETRIABLE_CODES = frozenset({320, 405, 504, 506, 541})

#: What pika and the sockets under it raise; anything else is a bug and propagates as is.
DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    amqp.AMQPError,
    AMQPConnectorException,
    OSError,
    TimeoutError,
)

_LOGIN_REFUSED: tuple[type[BaseException], ...] = (
    amqp.ProbableAuthenticationError,
    amqp.ProbableAccessDeniedError,
    amqp.AuthenticationError,
)

_UNAVAILABLE: tuple[type[BaseException], ...] = (
    amqp.AMQPConnectionError,
    amqp.AMQPChannelError,
    AMQPConnectorException,
    OSError,
    TimeoutError,
)

_PER_MESSAGE: tuple[type[BaseException], ...] = (
    amqp.ShortStringTooLong,
    amqp.UnsupportedAMQPFieldException,
    UnicodeEncodeError,
)

_HINTS = {
    404: "; run `bridge install` to create it",
    403: "; check the user's permissions on the vhost",
    530: "; check the vhost in the URL and the user's access to it",
}

_OVERSIZED = re.compile(r"message size (\d+) is larger than", re.IGNORECASE)


def _detail(exc: BaseException) -> str:
    code = getattr(exc, "reply_code", None)
    text = getattr(exc, "reply_text", None)
    if isinstance(exc, amqp.ChannelClosed | amqp.ConnectionClosed) and text is not None:
        return f"({code}) {text}{_HINTS.get(int(code or 0), '')}"
    cause = _connect_failure(exc)
    if cause is not None:
        return f"cannot connect: {cause!r}"
    detail = " ".join(str(exc).split()) or type(exc).__name__
    if type(exc).__name__ not in detail:
        detail = f"{type(exc).__name__}: {detail}"
    return detail


def _connect_failure(exc: BaseException) -> BaseException | None:
    """The socket, DNS or handshake error inside pika's connection-workflow failure, if any."""
    if isinstance(exc, AMQPConnectorException):
        workflow: object = exc
    elif isinstance(exc, amqp.AMQPConnectionError) and exc.args:
        workflow = exc.args[0]
    else:
        return None
    attempts = getattr(workflow, "exceptions", None)
    if not attempts:
        return None
    last = attempts[-1]
    inner = getattr(last, "exception", last)
    return inner if isinstance(inner, BaseException) else None


def oversized_body(exc: BaseException) -> int | None:
    """The body size the broker refused (406 over `max_message_size`), or None."""
    if isinstance(exc, amqp.ChannelClosed) and exc.reply_code == 406:
        match = _OVERSIZED.search(str(exc.reply_text))
        if match:
            return int(match.group(1))
    return None


def reply_code(error: BaseException) -> int | None:
    """The AMQP reply code behind a translated error (404, 406, ...), when there is one."""
    for exc in (error, error.__cause__):
        code = getattr(exc, "reply_code", None)
        if isinstance(code, int):
            return code
    return None


def translate(exc: BaseException, where: str, *, index: int | None = None) -> BridgeError:
    """The bridge error for `exc`, raised by `where` (e.g. "rabbitmq connection 'rabbit'").

    The driver's exception is kept as `__cause__`, also when the error is raised later.
    """
    if isinstance(exc, BridgeError):
        return exc
    error = _translate(exc, where, index)
    error.__cause__ = exc
    return error


def _translate(exc: BaseException, where: str, index: int | None) -> BridgeError:
    message = f"{where}: {_detail(exc)}"
    if index is not None and isinstance(exc, _PER_MESSAGE):
        return MessageRejected(message, index=index)
    cause = exc if isinstance(exc, ssl.SSLError) else _connect_failure(exc)
    if isinstance(cause, ssl.SSLCertVerificationError):
        return TlsRefused(
            f"{where}: no verified TLS connection: certificate verify failed: "
            f"{cause.verify_message}"
        )
    if isinstance(exc, _LOGIN_REFUSED):
        return AccessRefused(f"{where}: the broker refused the connection: {_detail(exc)}")
    if isinstance(exc, amqp.ChannelClosed | amqp.ConnectionClosed):
        if isinstance(exc, amqp.ChannelClosedByClient | amqp.ConnectionClosedByClient):
            return TransportUnavailable(message)
        if exc.reply_code in RETRIABLE_CODES:
            return TransportUnavailable(message)
        if exc.reply_code == 403 or (
            exc.reply_code == 530 and isinstance(exc, amqp.ConnectionClosed)
        ):
            return AccessRefused(message)
        return TransportError(message)
    if isinstance(exc, _UNAVAILABLE):
        return TransportUnavailable(message)
    return TransportError(message)


@contextmanager
def translated(where: str, *, index: int | None = None) -> Iterator[None]:
    """Raise driver errors from the block as bridge errors (see `translate`)."""
    try:
        yield
    except DRIVER_ERRORS as exc:
        raise translate(exc, where, index=index) from exc
