"""A server certificate that does not verify is `TlsRefused` on every transport: a refusal
(`AccessRefused`, never retriable), not an unreachable server retried for ever.

The real refusals, from servers with certificates of a throwaway CA, are in
tests/integration/test_tls.py; here the drivers' errors are built as they raise them, with the
variants the integration tests cannot all make (libpq's other wordings, a handshake cut short).
"""

from __future__ import annotations

import ssl

import psycopg
import pytest
from aiokafka.errors import KafkaConnectionError
from pika import exceptions as amqp
from pika.adapters.utils.connection_workflow import (
    AMQPConnectionWorkflowFailed,
    AMQPConnectorTransportSetupError,
)

from bridge.errors import AccessRefused, TlsRefused, TransportUnavailable
from bridge.transports.kafka import errors as kafka
from bridge.transports.rabbitmq import errors as rabbitmq
from bridge.transports.sql.dialects import postgresql
from bridge.transports.sql.errors import translate

PG = "postgresql connection 'secure'"
FAILED = 'connection failed: connection to server at "127.0.0.1", port 5432 failed: '


def verify_error(message: str) -> ssl.SSLCertVerificationError:
    """As Python's ssl module raises it for a certificate that does not verify."""
    error = ssl.SSLCertVerificationError(
        1, f"[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: {message} (_ssl.c:1006)"
    )
    error.verify_message = message
    return error


def test_tls_refused_is_a_refusal_that_is_not_retried() -> None:
    assert issubclass(TlsRefused, AccessRefused)
    assert TlsRefused.retriable is False


@pytest.mark.parametrize(
    "libpq",
    [
        "SSL error: certificate verify failed",
        'server certificate for "localhost" does not match host name "127.0.0.1"',
        'server certificate for "localhost" (and 1 other name) does not match host name "db"',
        "could not get server's host name from server certificate",
        'root certificate file "/etc/bridge/ca.pem" does not exist\nEither provide the file, '
        "use the system's trusted roots with sslrootcert=system, or change sslmode to disable "
        "server certificate verification.",
        "server does not support SSL, but SSL was required",
    ],
)
def test_postgresql_what_libpq_refuses_about_tls(libpq: str) -> None:
    error = translate(psycopg.OperationalError(FAILED + libpq), PG, postgresql.classify)
    assert isinstance(error, TlsRefused)
    assert str(error).startswith(f"{PG}: no verified TLS connection: {FAILED}")


def test_postgresql_an_unreachable_server_is_still_retried() -> None:
    error = translate(
        psycopg.OperationalError(FAILED + "Connection refused"), PG, postgresql.classify
    )
    assert isinstance(error, TransportUnavailable)


def test_rabbitmq_a_certificate_that_does_not_verify() -> None:
    mismatch = verify_error("IP address mismatch, certificate is not valid for '127.0.0.1'.")
    workflow = AMQPConnectionWorkflowFailed([AMQPConnectorTransportSetupError(mismatch)])
    where = "rabbitmq connection 'secure'"
    error = rabbitmq.translate(amqp.AMQPConnectionError(workflow), where)
    assert isinstance(error, TlsRefused)
    assert str(error) == (
        f"{where}: no verified TLS connection: certificate verify failed: "
        "IP address mismatch, certificate is not valid for '127.0.0.1'."
    )
    assert isinstance(rabbitmq.translate(mismatch, where), TlsRefused)


def test_rabbitmq_a_handshake_cut_short_is_retried() -> None:
    cut = AMQPConnectionWorkflowFailed(
        [AMQPConnectorTransportSetupError(ssl.SSLEOFError(8, "EOF occurred in violation"))]
    )
    error = rabbitmq.translate(amqp.AMQPConnectionError(cut), "rabbitmq connection 'secure'")
    assert isinstance(error, TransportUnavailable)


def test_kafka_a_bootstrap_that_failed_on_a_certificate() -> None:
    """aiokafka logs the handshake's error and raises only "Unable to bootstrap"."""
    logged = [verify_error("unable to get local issuer certificate")]
    bootstrap = KafkaConnectionError("Unable to bootstrap from [('localhost', 9093, 0)]")
    error = kafka.translate(bootstrap, "connect", logged=logged)
    assert isinstance(error, TlsRefused)
    assert str(error) == (
        "kafka: connect: no verified TLS connection: certificate verify failed: "
        "unable to get local issuer certificate"
    )
    assert isinstance(kafka.translate(bootstrap, "connect"), TransportUnavailable)
