"""A refused login or access is `AccessRefused` on every transport: never retriable, so
`--until-idle` and `check --connect` stop at it and a service shows the route failing.

PostgreSQL, RabbitMQ and SQLite refuse for real in tests/integration/test_refused_access.py.
There is no SQL Server here, and the local Kafka broker (tansu) cannot refuse a SASL login the
way Apache Kafka does, so their drivers' errors are built here as the drivers raise them.
"""

from __future__ import annotations

import logging

import pyodbc
import pytest
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    UnsupportedSaslMechanismError,
)
from pika import exceptions as amqp

from bridge.errors import AccessRefused, TransportError, TransportUnavailable
from bridge.transports.kafka import errors as kafka
from bridge.transports.rabbitmq import errors as rabbitmq
from bridge.transports.sql.dialects import sqlserver
from bridge.transports.sql.errors import translate

SQLSERVER = "sqlserver connection 'legacy'"


@pytest.mark.parametrize(
    "error",
    [
        # pyodbc's message for a wrong password or an unknown login (ODBC Driver 17 and 18,
        # github.com/ESSolutions/django-mssql-backend/issues/89)
        pyodbc.InterfaceError(
            "28000",
            "[28000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Login failed for user "
            "'bridge'. (18456) (SQLDriverConnect)",
        ),
        # a database the login may not open, after the login's own refusal
        # (github.com/yehoshuadimarsky/bcpandas/issues/28)
        pyodbc.InterfaceError(
            "28000",
            "[28000] [Microsoft][ODBC Driver 17 for SQL Server][SQL Server]Login failed for user "
            "'sa'. (18456) (SQLDriverConnect); [28000] [Microsoft][ODBC Driver 17 for SQL "
            'Server][SQL Server]Cannot open database "qq" requested by the login. The login '
            "failed. (4060)",
        ),
        # a refusal behind an 08001 "unable to connect" record: the login decides
        pyodbc.OperationalError(
            "08001",
            "[08001] [FreeTDS][SQL Server]Unable to connect to data source (0) (SQLDriverConnect); "
            "[28000] [FreeTDS][SQL Server]Login failed for user 'bridge'. (18456)",
        ),
        pyodbc.ProgrammingError(
            "42000",
            "[42000] [FreeTDS][SQL Server]The DELETE permission was denied on the object "
            "'Sales', database 'nservicebus', schema 'dbo'. (229) (SQLExecDirectW)",
        ),
        pyodbc.ProgrammingError(
            "42000",
            "[42000] [FreeTDS][SQL Server]CREATE TABLE permission denied in database "
            "'nservicebus'. (262) (SQLExecDirectW)",
        ),
    ],
    ids=["login-failed", "cannot-open-database", "freetds-unable-to-connect", "229", "262"],
)
def test_sql_server_refusals(error: BaseException) -> None:
    translated = translate(error, SQLSERVER, sqlserver.classify)
    assert isinstance(translated, AccessRefused)
    assert not translated.retriable
    assert str(translated).startswith(f"{SQLSERVER}: access refused: ")


@pytest.mark.parametrize(
    "error",
    [
        pyodbc.OperationalError("08S01", "[08S01] [FreeTDS][SQL Server]Communication link failure"),
        pyodbc.OperationalError("HYT00", "[HYT00] [FreeTDS][SQL Server]Login timeout expired (0)"),
        pyodbc.ProgrammingError(
            "42S02", "[42S02] [FreeTDS][SQL Server]Invalid object name 'dbo.Sales'. (208)"
        ),
    ],
    ids=["link-failure", "login-timeout", "missing-table"],
)
def test_sql_server_errors_that_are_not_refusals(error: BaseException) -> None:
    translated = translate(error, SQLSERVER, sqlserver.classify)
    assert not isinstance(translated, AccessRefused)


@pytest.mark.parametrize(
    ("error", "where"),
    [
        (amqp.ProbableAuthenticationError("ACCESS_REFUSED - Login was refused"), "refused"),
        (amqp.ProbableAccessDeniedError("NOT_ALLOWED - vhost x not found"), "refused"),
        (amqp.ConnectionClosedByBroker(530, "NOT_ALLOWED - access to vhost 'x' refused"), "530"),
        (amqp.ChannelClosedByBroker(403, "ACCESS_REFUSED - access to queue 'Sales'"), "403"),
    ],
    ids=["login", "vhost", "vhost-on-open", "queue-permission"],
)
def test_rabbitmq_refusals(error: BaseException, where: str) -> None:
    translated = rabbitmq.translate(error, "rabbitmq connection 'rabbit'")
    assert isinstance(translated, AccessRefused)
    assert not translated.retriable
    assert where in str(translated)


@pytest.mark.parametrize(
    "error",
    [
        SaslAuthenticationFailed("Authentication failed: Invalid username or password"),
        UnsupportedSaslMechanismError("Kafka broker does not support PLAIN sasl mechanism"),
        TopicAuthorizationFailedError("sales"),
        GroupAuthorizationFailedError("bridge"),
        ClusterAuthorizationFailedError(),
    ],
    ids=lambda error: type(error).__name__,
)
def test_kafka_refusals(error: BaseException) -> None:
    translated = kafka.translate(error, "connection 'k': start the producer")
    assert isinstance(translated, AccessRefused)
    assert not translated.retriable
    assert type(error).__name__ in str(translated)


def test_a_kafka_bootstrap_that_failed_on_a_refused_login_is_that_refusal() -> None:
    """aiokafka's bootstrap logs why it could not use a broker (aiokafka/client.py, `bootstrap`:
    `log.error('Unable connect to "%s:%s": %s', host, port, err)` on the logger "aiokafka") and
    raises only "Unable to bootstrap from ...". tests/integration/test_refused_access.py goes
    through aiokafka's real bootstrap; this pins that only a refusal logged inside the block
    counts."""
    client = logging.getLogger("aiokafka")
    refusal = SaslAuthenticationFailed("Authentication failed: Invalid username or password")
    starting = kafka.translated("connection 'k': start the producer")
    with pytest.raises(AccessRefused, match="SaslAuthenticationFailed") as caught, starting:
        client.error('Unable connect to "%s:%s": %s', "kafka", 9092, refusal)
        raise KafkaConnectionError("Unable to bootstrap from [('kafka', 9092)]")
    assert "Invalid username or password" in str(caught.value)
    # outside any block, or in a later one, an old refusal means nothing
    client.error('Unable connect to "%s:%s": %s', "kafka", 9092, refusal)
    with pytest.raises(TransportUnavailable), kafka.translated("connection 'k': list topics"):
        raise KafkaConnectionError("Unable to bootstrap from [('kafka', 9092)]")
    with pytest.raises(TransportUnavailable), kafka.translated("connection 'k': list topics"):
        client.error('Unable connect to "%s:%s": %s', "kafka", 9092, OSError("refused"))
        raise KafkaConnectionError("Unable to bootstrap from [('kafka', 9092)]")


def test_a_refusal_is_a_transport_error_and_never_retriable() -> None:
    assert issubclass(AccessRefused, TransportError)
    assert AccessRefused.retriable is False
