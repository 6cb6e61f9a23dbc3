"""One exception tree. Whether a failure may go away is data on the class: `retriable`.

Transport packages translate their driver's exceptions into these in one place each
(`transports/<name>/errors.py`), so the runner decides from `retriable` alone.
"""

from __future__ import annotations

__all__ = [
    "BridgeError",
    "ConfigError",
    "HeadersFormatError",
    "MessageRejected",
    "SettleError",
    "TransportError",
    "TransportUnavailable",
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


class HeadersFormatError(BridgeError):
    """A message's headers cannot be read: the message is poison."""


class TransportError(BridgeError):
    """A transport operation failed for a reason that will not go away by retrying."""


class TransportUnavailable(TransportError):
    """Broker or database unreachable, timed out, deadlocked: retry with backoff."""

    retriable = True


class MessageRejected(TransportError):
    """The destination refused one message for good (too large, unroutable): error queue."""

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


class SettleError(BridgeError):
    """A batch was committed or aborted twice, or used after it was settled."""
