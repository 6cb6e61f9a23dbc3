"""How the bridge connects to Kafka: `KafkaConnection` to the keyword arguments of aiokafka's
clients.

Guarantees: the producer always waits for every in-sync replica (`acks="all"`); idempotence
follows `idempotence` (on by default; the local tansu broker needs it off). Consumers never
auto-commit (a source commits only what its sink made durable), start from the earliest record
when their group has no committed offset, fetch records up to `max_request_size`, and wait at
most `FETCH_MAX_WAIT_MS` at the broker for records to arrive.

Silent networks: every request of every client waits at most `request_timeout_ms` for its
answer, then aiokafka drops the connection and the call fails (`KafkaTimeoutError`,
`RequestTimedOutError`: retriable). A send waits for its produce request; an idle source asks
for the topic's end offsets every second (`source.py`, for readiness), so it notices too. TCP
keepalives cannot help (a stalled peer's kernel may still acknowledge), nor do
`connections_max_idle_ms` or `metadata_max_age_ms`, which act on idle connections.

Every client is built through `client_kwargs`, which raises `ConfigError` for the rules of
`config.py` and for certificate files that cannot be loaded. With `security_protocol` SSL or
SASL_SSL the context is aiokafka's `create_ssl_context`: it verifies every broker's certificate
chain against `ssl_cafile` (else the system's CAs) and its host name (the bootstrap entry's,
then the one each broker advertises), which cannot be turned off; a certificate that does not
verify is `TlsRefused` (`errors.py`).
The password only ever goes to aiokafka; it is never part of a message or a log line.
"""

from __future__ import annotations

from typing import Any

from aiokafka.helpers import create_ssl_context

from bridge.errors import ConfigError
from bridge.transports.kafka.config import KafkaConnection, validate

__all__ = ["FETCH_MAX_WAIT_MS", "client_kwargs", "consumer_kwargs", "producer_kwargs"]

_MIN_FETCH_BYTES = 1_048_576
#: How long a fetch may wait at the broker for records. Kafka answers a waiting fetch as soon as
#: a record arrives, so this only sets how often an idle consumer asks again; brokers that hold
#: every fetch for the whole wait (tansu, the local test broker) add up to this much latency, so
#: it is kept well below aiokafka's 500 ms (20 empty fetches a second per idle source).
FETCH_MAX_WAIT_MS = 50


def client_kwargs(config: KafkaConnection) -> dict[str, Any]:
    """What every aiokafka client (admin included) takes: where the brokers are, how to log in."""
    validate(config)
    kwargs: dict[str, Any] = {
        "bootstrap_servers": config.bootstrap_servers,
        "client_id": config.client_id,
        "security_protocol": config.security_protocol,
        "request_timeout_ms": config.request_timeout_ms,
    }
    if config.sasl_mechanism is not None:
        kwargs["sasl_mechanism"] = config.sasl_mechanism
        kwargs["sasl_plain_username"] = config.sasl_username
        kwargs["sasl_plain_password"] = config.sasl_password
    if config.security_protocol.endswith("SSL"):
        try:
            kwargs["ssl_context"] = create_ssl_context(
                cafile=config.ssl_cafile, certfile=config.ssl_certfile, keyfile=config.ssl_keyfile
            )
        except OSError as exc:  # ssl.SSLError included
            raise ConfigError(f"kafka: cannot load the SSL certificate files: {exc}") from exc
    return kwargs


def producer_kwargs(config: KafkaConnection) -> dict[str, Any]:
    return {
        **client_kwargs(config),
        "acks": "all",
        "enable_idempotence": config.idempotence,
        "compression_type": config.compression_type,
        "max_batch_size": config.max_batch_size,
        "max_request_size": config.max_request_size,
    }


def consumer_kwargs(config: KafkaConnection, group: str | None) -> dict[str, Any]:
    """A consumer in `group` (None: no group, for peeking) that never commits on its own."""
    return {
        **client_kwargs(config),
        "group_id": group,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "max_partition_fetch_bytes": max(_MIN_FETCH_BYTES, config.max_request_size),
        "fetch_max_wait_ms": FETCH_MAX_WAIT_MS,
        "session_timeout_ms": config.session_timeout_ms,
        "heartbeat_interval_ms": max(100, config.session_timeout_ms // 3),
    }
