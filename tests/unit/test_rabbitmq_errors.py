"""pika failures -> bridge errors (bridge/transports/rabbitmq/errors.py), in one place."""

from __future__ import annotations

import socket
from typing import Any, cast

import pika
import pytest
from pika import exceptions as amqp
from pika.adapters.utils.connection_workflow import (
    AMQPConnectionWorkflowFailed,
    AMQPConnectorSocketConnectError,
)

from bridge.errors import MessageRejected, TransportError, TransportUnavailable
from bridge.transports.rabbitmq.confirms import Publish
from bridge.transports.rabbitmq.errors import oversized_body, reply_code, translate, translated
from bridge.transports.rabbitmq.handoff import Done

WHERE = "rabbitmq connection 'rabbit'"


@pytest.mark.parametrize(
    "exc",
    [
        amqp.ConnectionClosedByBroker(320, "CONNECTION_FORCED - broker forced connection closure"),
        amqp.ChannelClosedByBroker(541, "INTERNAL_ERROR"),
        amqp.ChannelClosedByBroker(506, "RESOURCE_ERROR"),
        amqp.ChannelClosedByBroker(405, "RESOURCE_LOCKED - cannot obtain exclusive access"),
        amqp.StreamLostError("Stream connection lost: ConnectionResetError(104)"),
        amqp.AMQPHeartbeatTimeout("No activity or too many missed heartbeats"),
        amqp.ConnectionBlockedTimeout("Blocked for too long"),
        amqp.ChannelWrongStateError("Channel is closed."),
        amqp.ConnectionWrongStateError("Connection is closed."),
        amqp.ChannelClosedByClient(200, "Normal shutdown"),
        ConnectionRefusedError(111, "Connection refused"),
        TimeoutError(),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_what_goes_away_is_retriable(exc: BaseException) -> None:
    error = translate(exc, WHERE)
    assert isinstance(error, TransportUnavailable)
    assert error.retriable
    assert error.__cause__ is exc


@pytest.mark.parametrize(
    ("exc", "text"),
    [
        (amqp.ChannelClosedByBroker(404, "NOT_FOUND - no queue 'Sales' in vhost '/'"), "install"),
        (amqp.ChannelClosedByBroker(406, "PRECONDITION_FAILED - inequivalent arg"), "406"),
        (amqp.ChannelClosedByBroker(530, "NOT_ALLOWED - attempt to reuse consumer tag"), "530"),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else "",
)
def test_what_stays_is_a_transport_error_with_a_clear_message(
    exc: BaseException, text: str
) -> None:
    error = translate(exc, WHERE)
    assert type(error) is TransportError
    assert not error.retriable
    assert str(error).startswith(f"{WHERE}: ")
    assert text in str(error)


def test_reply_codes_stay_readable_after_translation() -> None:
    error = translate(amqp.ChannelClosedByBroker(404, "NOT_FOUND"), WHERE)
    assert reply_code(error) == 404
    assert reply_code(TransportUnavailable("x")) is None


def test_a_refused_connection_names_its_cause() -> None:
    workflow = AMQPConnectionWorkflowFailed(
        [AMQPConnectorSocketConnectError(ConnectionRefusedError(111, "Connection refused"))]
    )
    error = translate(amqp.AMQPConnectionError(workflow), WHERE)
    assert isinstance(error, TransportUnavailable)
    assert (
        str(error) == f"{WHERE}: cannot connect: ConnectionRefusedError(111, 'Connection refused')"
    )
    unresolved = AMQPConnectionWorkflowFailed([socket.gaierror(-2, "Name or service not known")])
    assert isinstance(translate(unresolved, WHERE), TransportUnavailable)


def test_encoding_failures_reject_the_message_when_its_index_is_known() -> None:
    long_name = amqp.ShortStringTooLong("x" * 300)
    rejected = translate(long_name, WHERE, index=3)
    assert isinstance(rejected, MessageRejected)
    assert rejected.index == 3
    assert not isinstance(translate(long_name, WHERE), MessageRejected)


def test_bridge_errors_pass_through_and_other_bugs_propagate() -> None:
    original = MessageRejected("no", index=1)
    assert translate(original, WHERE) is original
    with pytest.raises(TransportUnavailable), translated(WHERE):
        raise amqp.StreamLostError("lost")
    with pytest.raises(KeyError), translated(WHERE):
        raise KeyError("a bug stays a bug")


def test_an_oversized_body_is_told_apart() -> None:
    refused = amqp.ChannelClosedByBroker(
        406, "PRECONDITION_FAILED - message size 2000 is larger than configured max size 1000"
    )
    assert oversized_body(refused) == 2000
    assert oversized_body(amqp.ChannelClosedByBroker(406, "PRECONDITION_FAILED - other")) is None


class _Recorder:
    def __init__(self) -> None:
        self.failed: BaseException | None = None

    def ok(self, value: Any = None) -> None:
        raise AssertionError("not expected")

    def fail(self, error: BaseException) -> None:
        self.failed = error


def test_a_publish_refused_for_size_rejects_the_oversized_message() -> None:
    recorder = _Recorder()
    messages = [
        (pika.BasicProperties(message_id=str(i)), b"x" * size)
        for i, size in enumerate([10, 2000, 20])
    ]
    publish = Publish(cast(Done, recorder), messages)
    publish.unconfirmed.update({0, 1, 2})
    reason = amqp.ChannelClosedByBroker(
        406, "PRECONDITION_FAILED - message size 2000 is larger than configured max size 1000"
    )
    publish.channel_lost(reason, translate(reason, WHERE))
    assert isinstance(recorder.failed, MessageRejected)
    assert recorder.failed.index == 1


def test_returns_are_matched_to_indexes_in_publish_order() -> None:
    recorder = _Recorder()
    messages = [(pika.BasicProperties(message_id=m), b"") for m in ["a", "b", "a", "c"]]
    publish = Publish(cast(Done, recorder), messages)
    publish.unconfirmed.update(range(4))
    assert publish.match_return("a", "(312) NO_ROUTE")
    assert publish.match_return("a", "(312) NO_ROUTE")
    assert not publish.match_return("zzz", "(312) NO_ROUTE")
    assert publish.outcome.returned == [0, 2]
