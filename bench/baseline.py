"""The baseline: one message per transaction, as the NServiceBus transports and the Messaging
Bridge move messages. Receive one row (or record, or delivery) in its transaction, send it and
wait for its ack, confirm or commit, then commit the receive; raw drivers, no bridge."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.legs import KafkaPlace, RabbitPlace, SqlPlace
from bench.messages import unique
from bridge.envelope import Envelope, Headers
from bridge.transports.kafka import headers as kafka_headers
from bridge.transports.rabbitmq import headers as amqp_headers

__all__ = ["ONE_BY_ONE"]


async def one_by_one_sql_kafka(source: SqlPlace, destination: KafkaPlace, n: int) -> float:
    db = source.connect()
    producer = destination.producer(linger_ms=0)
    await producer.start()
    try:
        started = time.perf_counter()
        for _ in range(n):
            taken = source.take_one(db)
            assert taken is not None
            headers, body = taken
            record = kafka_headers.outgoing(
                Envelope(Headers(headers.items()), body), _KEY, time.time()
            )
            await producer.send_and_wait(
                destination.address, record.value, key=record.key, headers=record.headers
            )
            db.commit()
        return time.perf_counter() - started
    finally:
        await producer.stop()
        db.close()


async def one_by_one_kafka_sql(source: KafkaPlace, destination: SqlPlace, n: int) -> float:
    consumer = source.consumer(unique("bench-one"))
    await consumer.start()
    consumer.subscribe([source.address])
    db = destination.connect()
    try:
        started = 0.0
        for _ in range(n):
            record = await consumer.getone()
            started = started or time.perf_counter()
            headers = {k: v.decode() for k, v in record.headers}
            destination.put_one(db, headers, record.value)
            tp = next(iter(consumer.assignment() & {_tp(record)}))
            await consumer.commit({tp: record.offset + 1})
        return time.perf_counter() - started
    finally:
        await consumer.stop()
        db.close()


async def one_by_one_sql_rabbitmq(source: SqlPlace, destination: RabbitPlace, n: int) -> float:
    def run() -> float:
        db = source.connect()
        connection = destination.blocking()
        try:
            channel = connection.channel()
            channel.confirm_delivery()  # basic_publish now waits for the broker's confirm
            started = time.perf_counter()
            for _ in range(n):
                taken = source.take_one(db)
                assert taken is not None
                headers, body = taken
                props, data = amqp_headers.outgoing(
                    Envelope(Headers(headers.items()), body), time.time()
                )
                channel.basic_publish(destination.address, "", data, props, mandatory=True)
                db.commit()
            return time.perf_counter() - started
        finally:
            connection.close()
            db.close()

    return await asyncio.to_thread(run)


async def one_by_one_rabbitmq_sql(source: RabbitPlace, destination: SqlPlace, n: int) -> float:
    def run() -> float:
        db = destination.connect()
        connection = source.blocking()
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=1)
            started = 0.0
            consume = channel.consume(source.address, inactivity_timeout=10)
            for got, (method, props, body) in enumerate(consume, 1):
                if method is None:
                    raise RuntimeError("baseline: the source ran dry")
                started = started or time.perf_counter()
                headers = {k: _text(v) for k, v in (props.headers or {}).items()}
                destination.put_one(db, headers, body)
                channel.basic_ack(method.delivery_tag)
                if got >= n:
                    break
            elapsed = time.perf_counter() - started
            channel.cancel()
            return elapsed
        finally:
            connection.close()
            db.close()

    return await asyncio.to_thread(run)


_KEY = "header:NServiceBus.MessageId"


def _tp(record: Any) -> Any:
    from aiokafka import TopicPartition

    return TopicPartition(record.topic, record.partition)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


#: The baseline of each route: (source, destination, messages) -> seconds.
ONE_BY_ONE = {
    "sql-kafka": one_by_one_sql_kafka,
    "kafka-sql": one_by_one_kafka_sql,
    "sql-rabbitmq": one_by_one_sql_rabbitmq,
    "rabbitmq-sql": one_by_one_rabbitmq_sql,
}
