"""RabbitMQConnection -> pika parameters and publish routes (rabbitmq/config.py)."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.config.models import RabbitMQConnection
from bridge.errors import ConfigError
from bridge.transports.rabbitmq import Transport
from bridge.transports.rabbitmq.config import lint, publish_route, queue_arguments
from bridge.transports.rabbitmq.connection import link, parameters


def config(**fields: Any) -> RabbitMQConnection:
    return RabbitMQConnection.model_validate(
        {"type": "rabbitmq", "url": "amqp://user:secret@broker:5673/sales", **fields}
    )


def test_parameters_come_from_the_url_with_the_bridge_defaults() -> None:
    params = parameters(config(), "rabbit", "sink")
    assert (params.host, params.port, params.virtual_host) == ("broker", 5673, "sales")
    assert params.credentials.username == "user"
    assert params.connection_attempts == 1
    assert params.blocked_connection_timeout == 60.0
    assert params.client_properties == {"connection_name": "bridge rabbit sink"}


def test_a_heartbeat_is_asked_for_when_the_url_names_none() -> None:
    """pika alone takes the broker's proposal (`_tune_heartbeat_timeout`), which may be none
    (a broker with `heartbeat = 0`): then a silent network is never noticed. The default, 60 s,
    is NServiceBus RabbitMQ's: `HeartbeatInterval { get; set; } = TimeSpan.FromSeconds(60)`
    (src/NServiceBus.Transport.RabbitMQ/RabbitMQTransport.cs:179-187), handed to the client as
    `RequestedHeartbeat` (src/NServiceBus.Transport.RabbitMQ/Connection/ConnectionFactory.cs:42)."""
    assert parameters(config(), "rabbit", "sink").heartbeat == 60
    assert parameters(config(heartbeat=5), "rabbit", "sink").heartbeat == 5
    assert parameters(config(heartbeat=0), "rabbit", "sink").heartbeat == 0  # off, as asked


def test_timeouts_are_settings_that_reach_the_links_and_the_connection() -> None:
    settings = config(connect_timeout=3, operation_timeout=4, confirm_timeout=5, blocked_timeout=6)
    made = link(settings, "rabbit", "sink", "where", confirm=True)
    assert (made.connect_timeout, made.operation_timeout, made.confirm_timeout) == (3, 4, 5)
    assert parameters(settings, "rabbit", "sink").blocked_connection_timeout == 6
    defaults = link(config(), "rabbit", "source", "where")
    assert (defaults.connect_timeout, defaults.operation_timeout) == (15, 30)
    assert defaults.confirm_timeout == 120


@pytest.mark.parametrize(
    ("option", "setting"),
    [("heartbeat=7", {"heartbeat": 9}), ("blocked_connection_timeout=5", {"blocked_timeout": 9})],
)
def test_a_setting_given_in_the_url_and_as_a_key_is_a_problem(
    option: str, setting: dict[str, int]
) -> None:
    (key,) = setting
    problems = list(lint(config(url=f"amqp://u:p@h/%2F?{option}", **setting)))
    assert problems == [
        (key, f"{key} is also given in the url ({option.split('=')[0]}); give it once")
    ]
    assert list(lint(config(url=f"amqp://u:p@h/%2F?{option}"))) == []


def test_an_http_management_url_is_refused_beside_an_amqps_url() -> None:
    """Its basic authentication would carry the login in clear that amqps keeps encrypted."""
    amqps = "amqps://u:secret@h/%2F"
    problems = list(lint(config(url=amqps, management_url="http://h:15672")))
    assert problems == [
        (
            "management_url",
            "management_url is http:// while the url is amqps://: the management API's login "
            "would cross the network unencrypted; use https://",
        )
    ]
    assert list(lint(config(url=amqps, management_url="https://h:15671"))) == []
    assert list(lint(config(url="amqp://u:p@h/%2F", management_url="http://h:15672"))) == []


def test_options_in_the_url_win() -> None:
    url = "amqp://u:p@h/%2F?heartbeat=7&connection_attempts=3&blocked_connection_timeout=5"
    params = parameters(config(url=url), "rabbit", "source")
    assert (params.heartbeat, params.connection_attempts) == (7, 3)
    assert params.blocked_connection_timeout == 5
    assert params.virtual_host == "/"


@pytest.mark.parametrize("url", ["http://h/", "broker:5672"])  # "": refused by the model
def test_a_url_that_is_not_amqp_is_a_config_error_without_secrets(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Transport("rabbit", config(url=url))
    assert "amqp://" in str(caught.value)
    assert "rabbit" in str(caught.value)


def test_topologies_route_to_the_exchange_or_the_queue() -> None:
    assert publish_route(config(topology="conventional"), "Sales") == ("Sales", "")
    assert publish_route(config(topology="direct"), "Sales") == ("", "Sales")


def test_queues_are_declared_with_their_type() -> None:
    assert queue_arguments(config()) == {"x-queue-type": "quorum"}
    assert queue_arguments(config(queue_type="classic")) == {"x-queue-type": "classic"}


async def test_print_only_writes_what_install_declares_as_management_api_requests() -> None:
    """AMQP has no client that runs a script of declarations; the management HTTP API takes
    each as one request (tests/integration/test_rabbitmq_print_sql.py runs them)."""
    transport = Transport("rabbit", config(url="amqp://bridge:pw@mq/shop", queue_type="classic"))
    curl = 'curl --fail-with-body -sS -u "$RABBITMQ_USER:$RABBITMQ_PASSWORD" -X'
    json = "-H 'content-type: application/json' -d"
    queue = """'{"durable":true,"auto_delete":false,"arguments":{"x-queue-type":"classic"}}'"""
    exchange = (
        """'{"type":"fanout","durable":true,"auto_delete":false,"internal":false,"""
        """"arguments":{}}'"""
    )
    binding = """'{"routing_key":"","arguments":{}}'"""
    api = "http://mq:15672/api"
    assert await transport.install(["Sales", "Sales Error", "Sales"], print_only=True) == [
        "# RabbitMQ's management HTTP API at http://mq:15672/ (vhost 'shop'): run with sh, curl "
        "7.76 or later,\n# and RABBITMQ_USER and RABBITMQ_PASSWORD set to a user with the "
        "`management` tag",
        f"{curl} PUT {json} {queue} {api}/queues/shop/Sales",
        f"{curl} PUT {json} {exchange} {api}/exchanges/shop/Sales",
        f"{curl} POST {json} {binding} {api}/bindings/shop/e/Sales/q/Sales",
        f"{curl} PUT {json} {queue} {api}/queues/shop/Sales%20Error",
        f"{curl} PUT {json} {exchange} {api}/exchanges/shop/Sales%20Error",
        f"{curl} POST {json} {binding} {api}/bindings/shop/e/Sales%20Error/q/Sales%20Error",
    ]
    assert "pw" not in "".join(await transport.install(["Sales"], print_only=True))
    assert transport.canonical_address("Sales") == "Sales"
    await transport.close()
