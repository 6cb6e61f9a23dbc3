"""aiokafka failures translated into the bridge's error tree, in this one place.

Retriable (`TransportUnavailable`): every aiokafka error whose class says `retriable`
(connection lost, no leader, request timed out, coordinator moving, ...), plus
`KafkaTimeoutError` (a request or a full send buffer timed out: the broker is slow or away),
`KafkaConnectionError` and plain `OSError`/`TimeoutError`.

One message refused for good (`MessageRejected`, only when the caller names the envelope's
index): the record is too large for the producer or the broker, or the broker refused the
record's timestamp. An invalid topic name is the route's, not a message's: it fails the route
(every message would otherwise be sent to the error queue). A topic that does not exist is
decided by the sink (it lists the cluster's topics first), because
`UnknownTopicOrPartitionError` on its own also means "created a moment ago, not visible yet"
and aiokafka marks it retriable.

Refused (`AccessRefused`, not retriable): a failed SASL login (`SaslAuthenticationFailed`,
`AuthenticationFailedError`, a mechanism the broker does not offer) and a missing ACL
(`TopicAuthorizationFailedError`, `GroupAuthorizationFailedError`,
`ClusterAuthorizationFailedError`, transactional id and delegation token authorization). While
it bootstraps, aiokafka logs a broker's refusal and raises only `KafkaConnectionError("Unable
to bootstrap from ...")`, which would be retried for ever: `translated` therefore watches the
`aiokafka` logger for the refusals logged inside its block, and a bootstrap failure that
followed one is that refusal. So is a broker certificate that does not verify with
`security_protocol` SSL or SASL_SSL (`ssl.SSLCertVerificationError`: not signed by `ssl_cafile`'s
CAs, or for another host name than the one connected to): `TlsRefused`, never retried without
verification.

Everything else (unsupported codec, fenced producer, consumer stopped) is a `TransportError`
that retrying will not fix. Errors that already are bridge errors pass through.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from aiokafka.errors import (
    AuthenticationFailedError,
    AuthenticationMethodNotSupported,
    ClusterAuthorizationFailedError,
    ConsumerStoppedError,
    DelegationTokenAuthorizationFailed,
    GroupAuthorizationFailedError,
    IllegalOperation,
    IllegalSaslStateError,
    InvalidTimestampError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnsupportedSaslMechanismError,
)

from bridge.errors import (
    AccessRefused,
    BridgeError,
    MessageRejected,
    TlsRefused,
    TransportError,
    TransportUnavailable,
)

__all__ = ["DRIVER_ERRORS", "REFUSED", "translate", "translated"]

#: What aiokafka and the sockets under it raise; anything else is a bug and propagates as is.
DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    KafkaError,
    ConsumerStoppedError,
    IllegalOperation,
    OSError,
    TimeoutError,
)

_PER_MESSAGE: tuple[type[BaseException], ...] = (
    MessageSizeTooLargeError,
    RecordTooLargeError,
    RecordListTooLargeError,
    InvalidTimestampError,
)

_UNAVAILABLE: tuple[type[BaseException], ...] = (
    KafkaTimeoutError,
    KafkaConnectionError,
    OSError,
    TimeoutError,
)

#: A login or an access the brokers refused.
REFUSED: tuple[type[BaseException], ...] = (
    SaslAuthenticationFailed,
    AuthenticationFailedError,
    AuthenticationMethodNotSupported,
    UnsupportedSaslMechanismError,
    IllegalSaslStateError,
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    ClusterAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    DelegationTokenAuthorizationFailed,
)

#: What aiokafka logs while it bootstraps that makes its `KafkaConnectionError` a refusal.
_LOGGED_REFUSALS: tuple[type[BaseException], ...] = (*REFUSED, ssl.SSLCertVerificationError)

#: The refusals aiokafka logged inside the innermost `translated` block of this task.
_logged_refusals: ContextVar[list[BaseException] | None] = ContextVar(
    "kafka_logged_refusals", default=None
)


class _RefusalWitness(logging.Filter):
    """Keeps the refusals aiokafka's client logs (`Unable connect to "host:port": <error>`)
    where `translated` can find them; lets every record through."""

    def filter(self, record: logging.LogRecord) -> bool:
        seen = _logged_refusals.get()
        if seen is not None and isinstance(record.args, tuple):
            seen.extend(arg for arg in record.args if isinstance(arg, _LOGGED_REFUSALS))
        return True


# aiokafka's client module logs through the logger named "aiokafka" (aiokafka/client.py).
logging.getLogger("aiokafka").addFilter(_RefusalWitness())


def _detail(exc: BaseException) -> str:
    detail = str(exc) or type(exc).__name__
    if type(exc).__name__ not in detail:
        detail = f"{type(exc).__name__}: {detail}"
    return detail


def translate(
    exc: BaseException,
    where: str,
    *,
    index: int | None = None,
    logged: list[BaseException] | None = None,
) -> BridgeError:
    """The bridge error for `exc`, raised while doing `where` (e.g. "send to topic 'sales'");
    `logged`: the refusals aiokafka logged before it (see the module docstring)."""
    if isinstance(exc, BridgeError):
        return exc
    message = f"kafka: {where}: {_detail(exc)}"
    if index is not None and isinstance(exc, _PER_MESSAGE):
        return MessageRejected(message, index=index)
    if isinstance(exc, KafkaConnectionError) and logged:
        exc = logged[-1]
    if isinstance(exc, ssl.SSLCertVerificationError):
        return TlsRefused(
            f"kafka: {where}: no verified TLS connection: certificate verify failed: "
            f"{exc.verify_message}"
        )
    if isinstance(exc, REFUSED):
        return AccessRefused(f"kafka: {where}: refused: {_detail(exc)}")
    if isinstance(exc, _UNAVAILABLE) or getattr(exc, "retriable", False):
        return TransportUnavailable(message)
    return TransportError(message)


@contextmanager
def translated(where: str, *, index: int | None = None) -> Iterator[None]:
    """Raise driver errors from the block as bridge errors (see `translate`)."""
    logged: list[BaseException] = []
    token = _logged_refusals.set(logged)
    try:
        yield
    except DRIVER_ERRORS as exc:
        raise translate(exc, where, index=index, logged=logged) from exc
    finally:
        _logged_refusals.reset(token)
