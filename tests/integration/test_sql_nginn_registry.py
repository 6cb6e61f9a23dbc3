"""An NGinn.MessageBus endpoint in the endpoint registry, through real `bridge` processes: NGinn
endpoint Sales (SQLite, `layout: nginn`) sends to Billing (RabbitMQ) through Billing's proxy
table, and Billing's reply crosses back through Sales's proxy queue into Sales's own table with
the endpoints NGinn takes.

NGinn's side is its own statements, replayed (`tests.support.nginn`); RabbitMQ's is pika.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path

import pika
import pytest

from bridge.config.loader import load_config
from bridge.transports import load
from tests.support.cli import run_bridge
from tests.support.nginn import NGinn

pytestmark = pytest.mark.integration

ZONE = "Europe/Warsaw"
ORDER_TYPE = "Sales.Messages.OrderPlaced, Sales.Messages"
PAID_TYPE = "Billing.Messages.OrderPaid, Billing.Messages"


def bridge(config: Path, *args: str) -> str:
    result = run_bridge(*args, config=config)
    return result.stdout + result.stderr


async def test_request_and_reply_between_an_nginn_endpoint_and_rabbitmq_through_the_proxies(
    tmp_path: Path, rabbitmq_url: str, rabbitmq_queues: Callable[..., str]
) -> None:
    sales, billing = rabbitmq_queues("Sales"), rabbitmq_queues("Billing")
    lite = tmp_path / "nginn.db"
    config = tmp_path / "routes.yaml"
    # The alias in another case than NGinn's endpoints: NGinn compares endpoints without case
    # (Impl/SqlMessageTransport2.cs:1127, IsLocalEndpoint).
    config.write_text(
        textwrap.dedent(
            f"""\
            connections:
              legacy: {{type: sqlite, path: "{lite}", layout: nginn,
                        nginn: {{timezone: {ZONE}, alias: DB,
                                 types: {{Billing.OrderPaid: "{PAID_TYPE}"}}}}}}
              rabbit: {{type: rabbitmq, url: "{rabbitmq_url}", queue_type: quorum}}
            endpoints:
              {sales}: {{connection: legacy}}
              {billing}: {{connection: rabbit}}
            proxies: {{create: true}}
            """
        )
    )
    connections = load_config(config).config.connections
    own = load("legacy", connections["legacy"])
    await own.install([sales])  # Sales's own table, as NGinn's script makes it
    await own.close()
    broker = load("rabbit", connections["rabbit"])
    await broker.install([billing])  # Billing's own queue, as its installer makes it
    await broker.close()
    bridge(config, "install")

    # NGinn endpoint Sales sends to Billing: a row in the Billing proxy table on its database.
    NGinn("sqlite", str(lite), billing, ZONE).send(
        json.dumps({"$type": ORDER_TYPE, "OrderId": 7}),
        to=f"sql://db/{billing}",
        from_endpoint=f"sql://db/{sales}",
        unique_id="order-7",
        correlation_id="c-7",
    )
    bridge(config, "run", "--until-idle", "2")
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        channel = connection.channel()
        method, properties, _ = channel.basic_get(billing, auto_ack=True)
        assert method is not None, f"nothing in {billing}"
        assert properties.message_id == "order-7"
        # from_endpoint sql://db/<Sales> is Sales, whose address on RabbitMQ is its proxy queue
        assert properties.headers["NServiceBus.ReplyToAddress"] == sales == properties.reply_to

        # Billing replies to the address it was given, as an NServiceBus RabbitMQ endpoint.
        channel.confirm_delivery()
        headers = {
            "NServiceBus.MessageId": "paid-7",
            "NServiceBus.MessageIntent": "Reply",
            "NServiceBus.CorrelationId": "c-7",
            "NServiceBus.ReplyToAddress": billing,
            "NServiceBus.EnclosedMessageTypes": "Billing.OrderPaid, Billing, Version=1.0.0.0",
        }
        channel.basic_publish(
            properties.reply_to,
            "",
            b'{"OrderId":7}',
            pika.BasicProperties(message_id="paid-7", headers=headers, delivery_mode=2),
            mandatory=True,
        )
    finally:
        connection.close()
    bridge(config, "run", "--until-idle", "2")

    # NGinn's own receive on Sales's table takes the reply as its own, from Billing's proxy.
    reply = NGinn("sqlite", str(lite), sales, ZONE, alias="DB").receive()
    assert reply is not None
    assert reply.to_endpoint == f"sql://DB/{sales}"
    assert reply.from_endpoint == f"sql://DB/{billing}"
    assert reply.unique_id == "paid-7" and reply.correlation_id == "c-7"
    assert json.loads(reply.body) == {"$type": PAID_TYPE, "OrderId": 7}
