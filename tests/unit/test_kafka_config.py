from __future__ import annotations

import ssl
from typing import Any

import pytest

from bridge.config.models import KafkaConnection
from bridge.errors import ConfigError
from bridge.transports.kafka.connection import client_kwargs, consumer_kwargs, producer_kwargs


def connection(**fields: Any) -> KafkaConnection:
    return KafkaConnection.model_validate(
        {"type": "kafka", "bootstrap_servers": "b:9092", **fields}
    )


def test_producer_waits_for_all_replicas_and_follows_idempotence() -> None:
    kwargs = producer_kwargs(
        connection(idempotence=False, compression_type="gzip", max_request_size=2_000_000)
    )
    assert kwargs["acks"] == "all"
    assert kwargs["enable_idempotence"] is False
    assert kwargs["compression_type"] == "gzip"
    assert kwargs["max_batch_size"] == 1_048_576
    assert kwargs["max_request_size"] == 2_000_000
    assert kwargs["bootstrap_servers"] == "b:9092"
    assert kwargs["client_id"] == "bridge"
    assert producer_kwargs(connection())["enable_idempotence"] is True


def test_consumer_never_auto_commits_and_fetches_what_a_producer_may_write() -> None:
    kwargs = consumer_kwargs(connection(max_request_size=5_000_000), "g")
    assert kwargs["group_id"] == "g"
    assert kwargs["enable_auto_commit"] is False
    assert kwargs["auto_offset_reset"] == "earliest"
    assert kwargs["max_partition_fetch_bytes"] == 5_000_000
    assert consumer_kwargs(connection(), None)["max_partition_fetch_bytes"] == 1_048_576


def test_plaintext_has_no_security_settings() -> None:
    kwargs = client_kwargs(connection())
    assert kwargs == {
        "bootstrap_servers": "b:9092",
        "client_id": "bridge",
        "security_protocol": "PLAINTEXT",
        "request_timeout_ms": 40_000,
    }


def test_every_client_waits_request_timeout_ms_for_an_answer() -> None:
    """What bounds a silent network (aiokafka's default, 40 s, when not set)."""
    settings = connection(request_timeout_ms=8_000, session_timeout_ms=6_000)
    for kwargs in (producer_kwargs(settings), consumer_kwargs(settings, "g")):
        assert kwargs["request_timeout_ms"] == 8_000


def test_a_request_timeout_within_the_session_timeout_is_a_config_error() -> None:
    """aiokafka's JoinGroup asks the broker to wait up to the rebalance timeout, which is the
    session timeout: a request timeout within it could drop every join."""
    with pytest.raises(ConfigError, match=r"request_timeout_ms .* must be more than"):
        client_kwargs(connection(request_timeout_ms=10_000, session_timeout_ms=10_000))


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_credentials_are_passed(mechanism: str) -> None:
    kwargs = client_kwargs(
        connection(
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism=mechanism,
            sasl_username="u",
            sasl_password="p",
        )
    )
    assert kwargs["sasl_mechanism"] == mechanism
    assert (kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]) == ("u", "p")
    assert "ssl_context" not in kwargs


def test_ssl_builds_a_context() -> None:
    kwargs = client_kwargs(
        connection(
            security_protocol="SASL_SSL",
            sasl_mechanism="PLAIN",
            sasl_username="u",
            sasl_password="p",
        )
    )
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext)


def test_missing_ca_file_fails_before_connecting() -> None:
    with pytest.raises(ConfigError, match="SSL certificate"):
        client_kwargs(connection(security_protocol="SSL", ssl_cafile="/nonexistent/ca.pem"))


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        (
            {"security_protocol": "SASL_SSL", "sasl_username": "u", "sasl_password": "p"},
            "sasl_mechanism",
        ),
        (
            {
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "PLAIN",
                "sasl_password": "p",
            },
            "sasl_username",
        ),
        ({"sasl_mechanism": "PLAIN"}, "does not use SASL"),
        ({"ssl_cafile": "ca.pem"}, "does not use SSL"),
        ({"security_protocol": "SSL", "ssl_certfile": "c.pem"}, "go together"),
    ],
)
def test_contradicting_security_settings_are_config_errors(
    fields: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ConfigError, match=needle) as caught:
        client_kwargs(connection(**fields))
    assert "p" not in caught.value.message.split()  # the password never appears
