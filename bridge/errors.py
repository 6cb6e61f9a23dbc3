"""One exception tree. Whether a failure may go away is data on the class: `retriable`.

Transport packages translate their driver's exceptions into these in one place each
(`transports/<name>/errors.py`), so the runner decides from `retriable` alone.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "AccessRefused",
    "BridgeError",
    "ConfigError",
    "ConfigErrors",
    "HeadersFormatError",
    "MessageRejected",
    "MessagesRejected",
    "SettleError",
    "TlsRefused",
    "TransportError",
    "TransportUnavailable",
    "UsageError",
]


class BridgeError(Exception):
    """Base of every error the bridge raises on purpose."""

    retriable: bool = False


class ConfigError(BridgeError):
    """Invalid configuration or usage; `location` is `FILE:LINE:COLUMN` when known."""

    def __init__(self, message: str, location: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.location = location

    def __str__(self) -> str:
        return f"{self.location}: {self.message}" if self.location else self.message


class ConfigErrors(ConfigError):
    """Several configuration errors found at once, each at its own location: one a line."""

    def __init__(self, errors: Sequence[ConfigError]) -> None:
        super().__init__(errors[0].message, errors[0].location)
        self.errors = list(errors)

    def __str__(self) -> str:
        return "\n".join(str(error) for error in self.errors)


class HeadersFormatError(BridgeError):
    """A message's headers cannot be read: the message is poison."""


class TransportError(BridgeError):
    """A transport operation failed for a reason that will not go away by retrying."""


class AccessRefused(TransportError):
    """The server refused the login or the access: a wrong password, an unknown user, database
    or vhost, missing grants or ACLs. Retrying does not fix it: it lasts until someone changes
    the account, its rights or the config (a service keeps trying, slowly: see the runner)."""


class TlsRefused(AccessRefused):
    """No verified TLS connection could be made: the server's certificate is not signed by a CA
    the connection trusts, is for another host name, or has expired; or the server does not
    offer TLS where the connection requires it. The bridge never falls back to a connection it
    cannot verify, and retrying does not fix it: a refusal, as a refused login is."""


class TransportUnavailable(TransportError):
    """Broker or database unreachable, timed out, deadlocked: retry with backoff."""

    retriable = True


class MessageRejected(TransportError):
    """The destination refused one message for good (too large, unroutable): error queue.

    `index` is its position in the `send` call, None when the sink cannot say which.
    """

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


class MessagesRejected(MessageRejected):
    """Messages of one `send` the destination refused for good, after it settled the whole call.

    `rejections` has one `MessageRejected` with its index for each refused message. With
    `rest_accepted` the destination durably accepted every other message of the call (a RabbitMQ
    publish confirmed them), so they must not be sent again; without it they must. As a plain
    `MessageRejected` it names the first refused message.
    """

    def __init__(self, rejections: Sequence[MessageRejected], *, rest_accepted: bool) -> None:
        first, count = rejections[0], len(rejections)
        text = str(first) if count == 1 else f"{count} messages refused; the first: {first}"
        super().__init__(text, index=first.index)
        self.rejections = tuple(rejections)
        self.rest_accepted = rest_accepted


class SettleError(BridgeError):
    """A batch was committed or aborted twice, or used after it was settled."""


class UsageError(BridgeError):
    """A command was called wrongly (an unknown connection or route, a malformed flag value):
    the command line, not the config or a transport, is at fault."""
