"""Which messages have a time to live at all (product.md, delivery semantics).

A message's lifetime is the transport's own field (SQL `Expires`, AMQP `expiration`, the Kafka
deadline header the bridge writes), never arithmetic on `NServiceBus.TimeToBeReceived`, which
travels as the endpoint wrote it. Error-queue copies (`NServiceBus.FailedQ`) and audit copies
(`NServiceBus.ProcessingEnded`) never expire: NServiceBus sends an error copy with the
original headers, TimeToBeReceived included, and no time to live, so a retry from ServicePulse
still has the header; and a copy that expired on its way to ServiceControl would be a failure
nobody sees. So a codec reads no lifetime for them (`never_expires`) and writes none
(`expires_at`), whatever the message's transport field says.
"""

from __future__ import annotations

from collections.abc import Container

from bridge.envelope import Envelope

__all__ = ["FAILED_Q", "PROCESSING_ENDED", "expires_at", "never_expires"]

FAILED_Q = "NServiceBus.FailedQ"
PROCESSING_ENDED = "NServiceBus.ProcessingEnded"


def never_expires(headers: Container[str]) -> bool:
    """True for an error-queue or an audit copy (`headers`: a `Headers` or a dictionary)."""
    return FAILED_Q in headers or PROCESSING_ENDED in headers


def expires_at(envelope: Envelope) -> float | None:
    """The deadline a sink writes for `envelope`: its `expires_at`, but None for a copy."""
    deadline = envelope.expires_at
    if deadline is None or never_expires(envelope.headers):
        return None
    return deadline
