"""What the bridge decides about a quorum source queue's delivery limit, and the policy it
creates, against NServiceBus RabbitMQ's BrokerVerifier (rabbitmq/delivery_limit.py).

Source read: Particular/NServiceBus.RabbitMQ@ec745bf, src/NServiceBus.Transport.RabbitMQ/
Administration/BrokerVerifier.cs (BV) and Administration/ManagementApi/ (Models/Queue.cs,
Models/Policy.cs, Converters/PolicyTargetConverter.cs, Converters/DeliveryLimitConverter.cs).
The queue details are shaped as the management API answers GET /api/queues/<vhost>/<name>:
RabbitMQ 3.10 (the broker the integration tests run) as seen there; RabbitMQ 4's
`delivery_limit` as Queue.cs:17-19 and DeliveryLimitConverter.cs:9-30 read it.
"""

from __future__ import annotations

from typing import Any

import pytest

from bridge.config.models import RabbitMQConnection
from bridge.errors import ConfigError
from bridge.transports.rabbitmq import Transport
from bridge.transports.rabbitmq.delivery_limit import (
    UNLIMITED,
    delivery_limit,
    escape_pattern,
    policy_for,
    policy_name,
    verdict,
)
from bridge.transports.rabbitmq.management import endpoint

V3 = (3, 10)
V4 = (4, 0)


def queue(
    *,
    kind: str = "quorum",
    argument: object = None,
    policy: str | None = None,
    definition: dict[str, Any] | None = None,
    reported: object = None,
) -> dict[str, Any]:
    arguments: dict[str, Any] = {"x-queue-type": kind}
    if argument is not None:
        arguments["x-delivery-limit"] = argument
    details: dict[str, Any] = {
        "name": "Sales",
        "type": kind,
        "arguments": arguments,
        "policy": policy,
        "operator_policy": None,
        "effective_policy_definition": definition or {},
    }
    if reported is not None:
        details["delivery_limit"] = reported
    return details


def test_the_policy_is_the_one_nservicebus_creates() -> None:
    # BV:203 name, BV:205-211 body: ApplyTo QuorumQueues ("quorum_queues",
    # PolicyTargetConverter.cs:32), DeliveryLimit Queue.BigValueInsteadOfActuallyUnlimited
    # (100_000, Queue.cs:71), Pattern $"^{Regex.Escape(queue.Name)}$", Priority 0; the JSON
    # names come from Policy.cs:7-18 and PolicyDefinition.cs:7.
    assert policy_name("Sales") == "nsb.Sales.delivery-limit"
    assert policy_for("Sales.Error") == {
        "pattern": "^Sales\\.Error$",
        "apply-to": "quorum_queues",
        "definition": {"delivery-limit": 100_000},
        "priority": 0,
    }


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("Sales", "Sales"),
        ("Sales.Error", "Sales\\.Error"),
        ("my-queue_1", "my-queue_1"),  # .NET leaves '-' alone (Python's re.escape would not)
        ("a b#c", "a\\ b\\#c"),
        ("x\ty\n", "x\\ty\\n"),
        ("(a|b)*+?{1}[c]^$\\", "\\(a\\|b\\)\\*\\+\\?\\{1}\\[c]\\^\\$\\\\"),
    ],
)
def test_the_pattern_is_escaped_as_dotnet_regex_escape_escapes_it(name: str, pattern: str) -> None:
    # BV:209 Regex.Escape: \, *, +, ?, |, {, [, (, ), ^, $, ., # and white space; ']' and '}'
    # stay as they are.
    assert escape_pattern(name) == pattern


@pytest.mark.parametrize(
    ("details", "limit"),
    [
        (queue(), UNLIMITED),  # RabbitMQ 3: nothing set, no default (Queue.cs:68)
        (queue(argument=5), 5),
        (queue(definition={"delivery-limit": 7}), 7),
        (queue(argument=9, definition={"delivery-limit": 7}), 7),  # the lower (Queue.cs:54-60)
        (queue(argument=-1), 0),  # RabbitMQ 3 treats a negative argument as 0 (Queue.cs:62-66)
        (queue(reported=20), 20),  # RabbitMQ 4 reports what applies (Queue.cs:37-41)
        (queue(reported="unlimited"), -1),  # DeliveryLimitConverter.cs:19-22
        (queue(argument=5, reported=100_000), 100_000),
    ],
)
def test_the_limit_is_read_as_nservicebus_reads_it(details: dict[str, Any], limit: int) -> None:
    assert delivery_limit(details) == limit


def test_classic_queues_are_left_alone() -> None:
    # BV:166-169
    assert verdict(queue(kind="classic", argument=1), V4).action == "none"


def test_unlimited_queues_need_nothing() -> None:
    # BV:173-176: on RabbitMQ 3 without any limit, and with the transport's policy on 4.
    assert verdict(queue(), V3).action == "none"
    assert verdict(queue(reported=UNLIMITED, policy="nsb.Sales.delivery-limit"), V4).action == (
        "none"
    )


def test_rabbitmq_4s_default_limit_gets_the_policy() -> None:
    # BV:188 (nothing set by the queue or a policy) then BV:191-215.
    assert verdict(queue(reported=20), V4).action == "policy"


def test_an_older_transport_policy_of_minus_one_is_rewritten() -> None:
    # BV:178-181: limit -1 with a policy named nsb.*.delivery-limit (BV:223).
    old = queue(reported=-1, policy="nsb.Sales.delivery-limit", definition={"delivery-limit": -1})
    assert verdict(old, V4).action == "policy"


@pytest.mark.parametrize(
    ("details", "version", "said"),
    [
        (queue(argument=5), V3, "set by its x-delivery-limit argument (5)"),
        (queue(argument=5, reported=5), V4, "set by its x-delivery-limit argument (5)"),
        (queue(argument=-1, reported=-1), V4, "x-delivery-limit argument (-1)"),
        (
            queue(policy="limits", definition={"delivery-limit": 3}),
            V3,
            "set by policy 'limits' (delivery-limit 3)",
        ),
    ],
)
def test_a_limit_someone_set_is_refused(
    details: dict[str, Any], version: tuple[int, int], said: str
) -> None:
    # BV:183-186: any delivery limit in the queue's arguments or in the effective policy
    # definition (user or operator policy), that is not the transport's own, is an error.
    decision = verdict(details, version)
    assert decision.action == "refuse"
    assert "'Sales'" in decision.reason
    assert said in decision.reason
    assert "remove the x-delivery-limit argument" in decision.reason


def test_another_policy_on_the_queue_is_not_replaced() -> None:
    # BV:198-201
    decision = verdict(queue(reported=20, policy="ha-all", definition={"ha-mode": "all"}), V4)
    assert decision.action == "refuse"
    assert "'ha-all' applies to the queue" in decision.reason
    assert '"delivery-limit": 100000' in decision.reason


def test_no_policy_before_rabbitmq_4() -> None:
    # BV:193-196 (unreachable on a real 3.x broker, whose only limits are ones someone set)
    assert verdict(queue(reported=20), V3).action == "refuse"


def config(**fields: Any) -> RabbitMQConnection:
    return RabbitMQConnection.model_validate({"type": "rabbitmq", **fields})


def test_the_management_api_is_found_from_the_amqp_url() -> None:
    # ManagementClient.cs:48-58: the AMQP host, port 15672 (15671 with TLS), the AMQP
    # credentials; :60 the vhost, escaped in each path.
    plain = endpoint(config(url="amqp://bridge:s%40cret@mq.example:5673/shop"))
    assert (plain.base, plain.username, plain.password, plain.vhost) == (
        "http://mq.example:15672/",
        "bridge",
        "s@cret",
        "shop",
    )
    tls = endpoint(config(url="amqps://u:p@mq.example/%2F"))
    assert (tls.base, tls.vhost) == ("https://mq.example:15671/", "/")


def test_management_url_wins_and_may_carry_its_own_credentials() -> None:
    # ManagementClient.cs:28-41: the configured URL, '/' appended; its user and password, else
    # the AMQP ones.
    given = endpoint(config(url="amqp://u:p@mq/%2F", management_url="https://admin.example/rmq"))
    assert (given.base, given.username, given.password) == ("https://admin.example/rmq/", "u", "p")
    own = endpoint(config(url="amqp://u:p@mq/%2F", management_url="http://ops:pw@mq:8080/"))
    assert (own.base, own.username, own.password) == ("http://mq:8080/", "ops", "pw")


@pytest.mark.parametrize("url", ["amqp://mq:15672/", "mq:15672", "http://:15672/"])
def test_a_management_url_that_is_not_http_is_a_config_error(url: str) -> None:
    # ManagementClient.cs:43-46 refuses other schemes.
    with pytest.raises(ConfigError, match="management_url"):
        Transport("rabbit", config(url="amqp://u:p@mq/%2F", management_url=url))


async def test_print_only_names_the_policy_for_quorum_sources_only() -> None:
    quorum = Transport("rabbit", config(url="amqp://u:p@mq/%2F"))
    (printed,) = await quorum.prepare_sources(["Sales", "Sales"], print_only=True)
    *said, request = printed.split("\n")
    assert all(line.startswith("# ") for line in said)
    assert "Only where RabbitMQ 4 limits quorum queue 'Sales'" in said[0]
    # commented out: only `bridge install` can tell whether NServiceBus would create it
    assert request == (
        '# curl --fail-with-body -sS -u "$RABBITMQ_USER:$RABBITMQ_PASSWORD" -X PUT '
        "-H 'content-type: application/json' -d "
        """'{"pattern":"^Sales$","apply-to":"quorum_queues","definition":{"delivery-limit":"""
        """100000},"priority":0}' http://mq:15672/api/policies/%2F/nsb.Sales.delivery-limit"""
    )
    classic = Transport("rabbit", config(url="amqp://u:p@mq/%2F", queue_type="classic"))
    assert await classic.prepare_sources(["Sales"], print_only=True) == []
