"""aiokafka errors become bridge errors in one place; `retriable` decides what the runner does."""

from __future__ import annotations

import pytest
from aiokafka.errors import (
    CommitFailedError,
    InvalidTimestampError,
    InvalidTopicError,
    KafkaConnectionError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    NotLeaderForPartitionError,
    RecordTooLargeError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)

from bridge.config.models import KafkaConnection
from bridge.envelope import MESSAGE_ID, Envelope, Headers
from bridge.errors import (
    ConfigError,
    MessageRejected,
    TransportError,
    TransportUnavailable,
)
from bridge.protocols import Sink, Source
from bridge.protocols import Transport as TransportProtocol
from bridge.transports.kafka import Transport
from bridge.transports.kafka.errors import translate, translated
from bridge.transports.kafka.producer import refused_batch


@pytest.mark.parametrize(
    "error",
    [
        KafkaConnectionError("gone"),
        KafkaTimeoutError(),
        NotLeaderForPartitionError(),
        RequestTimedOutError(),
        UnknownTopicOrPartitionError(),  # may be a topic created a moment ago
        ConnectionResetError(),
        TimeoutError(),
    ],
)
def test_what_may_go_away_is_retriable(error: BaseException) -> None:
    translated = translate(error, "send", index=3)
    assert type(translated) is TransportUnavailable
    assert translated.retriable


@pytest.mark.parametrize(
    "error",
    [MessageSizeTooLargeError(), RecordTooLargeError(), InvalidTimestampError()],
)
def test_a_record_refused_for_good_is_rejected_with_its_index(error: BaseException) -> None:
    translated = translate(error, "send to topic 'sales'", index=3)
    assert isinstance(translated, MessageRejected)
    assert translated.index == 3
    assert not translated.retriable
    assert "send to topic 'sales'" in str(translated)
    assert type(error).__name__ in str(translated)


@pytest.mark.parametrize("error", [MessageSizeTooLargeError(), RecordTooLargeError()])
def test_a_refused_batch_of_several_records_blames_none_of_them(error: BaseException) -> None:
    """The broker refuses a record batch as a whole: with one record in it, that record is the
    culprit; with more, the first may be innocent, so the runner must send each alone."""
    rejected = translate(error, "send to topic 'sales'", index=3)
    assert refused_batch(rejected, 1) is rejected
    several = refused_batch(rejected, 4)
    assert isinstance(several, MessageRejected) and several.index is None
    assert str(several) == str(rejected)
    unavailable = translate(KafkaTimeoutError(), "send", index=3)
    assert refused_batch(unavailable, 4) is unavailable


def test_without_an_index_a_per_record_error_is_not_a_rejection() -> None:
    translated = translate(MessageSizeTooLargeError(), "commit")
    assert type(translated) is TransportError


@pytest.mark.parametrize("error", [CommitFailedError(), InvalidTopicError()])
def test_the_rest_is_not_retriable(error: BaseException) -> None:
    translated = translate(error, "x", index=0)
    assert type(translated) is TransportError
    assert not translated.retriable


def test_bridge_errors_pass_through() -> None:
    original = MessageRejected("too big", index=1)
    assert translate(original, "x") is original


def test_the_context_manager_chains_the_driver_error() -> None:
    cause = KafkaConnectionError("refused")
    with pytest.raises(TransportUnavailable) as caught, translated("connect"):
        raise cause
    assert caught.value.__cause__ is cause
    with pytest.raises(ZeroDivisionError), translated("bugs are not driver errors"):
        _ = 1 / 0


def unreachable() -> Transport:
    config = {"type": "kafka", "bootstrap_servers": "127.0.0.1:1"}
    return Transport("k", KafkaConnection.model_validate(config))


async def test_header_kafka_cannot_carry_is_rejected_before_connecting() -> None:
    transport = unreachable()
    good = Envelope(Headers([(MESSAGE_ID, "a")]), b"")
    bad = Envelope(Headers([(MESSAGE_ID, "b"), ("x", "\udc80")]), b"")
    with pytest.raises(MessageRejected) as caught:
        await transport.sink("t").send([good, bad])
    assert caught.value.index == 1
    await transport.close()


def test_a_bad_key_spec_fails_when_the_sink_is_built() -> None:
    transport = unreachable()
    with pytest.raises(ConfigError, match="key must be"):
        transport.sink("t", key="conversation")


def test_it_keeps_the_transport_contracts() -> None:
    transport: TransportProtocol = unreachable()  # checked by mypy
    assert isinstance(transport.source("t", group="g"), Source)
    assert isinstance(transport.sink("t"), Sink)
