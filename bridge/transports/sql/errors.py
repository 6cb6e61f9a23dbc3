"""Driver exceptions -> bridge errors, in this one place; each dialect classifies its own.

Retriable (`TransportUnavailable`): the database cannot be reached or the connection broke,
timeouts, deadlocks, serialization failures, a busy/locked SQLite file, the server shutting
down or out of resources. A value the database refuses for good (a data exception: each
dialect's docstring lists which) is `MessageRejected` without an index (with one where the
caller names the message): in a sink's insert it is one message the destination can never
take, and the runner sends the batch one by one to find it. A refused login or access (wrong
password, unknown user or database, missing grants) is `AccessRefused`, whatever else the
driver says about the connection, and a server certificate that does not verify (or a server
without TLS where the DSN requires it) is `TlsRefused`. Everything else a driver raises (a
missing table) is a `TransportError`: retrying will not help.

Which is which is data in each dialect module (`classify`: codes and SQLSTATE classes), which
returns None for an exception that is not its driver's, so programming errors keep their own
type. Messages name the connection (`sqlite connection 'local'`), never its DSN: DSNs carry
secrets, and never a server's DETAIL, which can quote a row's message content.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from bridge.errors import (
    AccessRefused,
    BridgeError,
    MessageRejected,
    TlsRefused,
    TransportError,
    TransportUnavailable,
)

__all__ = ["Classify", "Failure", "translate", "translated"]


@dataclass(frozen=True, slots=True)
class Failure:
    """A dialect's verdict on one of its driver's exceptions."""

    retriable: bool
    rejected: bool = False  # a value refused for good: one message the table cannot take
    text: str | None = None  # what to say instead of str(exc) (never a server's DETAIL)
    refused: bool = False  # the login or the access was refused: permanent, whatever else
    tls_refused: bool = False  # no verified TLS connection: permanent, whatever else


#: A dialect's classification: None for an exception that is not its driver's.
Classify = Callable[[BaseException], Failure | None]


def translate(
    exc: BaseException, where: str, classify: Classify, *, index: int | None = None
) -> BridgeError | None:
    """The bridge error for `exc`, raised on `where` (e.g. "sqlite connection 'local'"); itself
    when it is one; None when it is not the driver's (it then propagates as is)."""
    if isinstance(exc, BridgeError):
        return exc
    failure = classify(exc)
    if failure is None:
        return None
    text = " ".join((failure.text or str(exc)).split()) or type(exc).__name__
    if failure.tls_refused:
        return TlsRefused(f"{where}: no verified TLS connection: {text}")
    if failure.refused:
        return AccessRefused(f"{where}: access refused: {text}")
    if failure.retriable:
        return TransportUnavailable(f"{where} unavailable: {text}")
    if failure.rejected:
        return MessageRejected(f"{where}: {text}", index=index)
    return TransportError(f"{where}: {text}")


@contextmanager
def translated(where: str, classify: Classify, *, index: int | None = None) -> Iterator[None]:
    """Raise the driver's exceptions from the block as bridge errors (see `translate`)."""
    try:
        yield
    except Exception as exc:
        error = translate(exc, where, classify, index=index)
        if error is None or error is exc:
            raise
        raise error from exc
