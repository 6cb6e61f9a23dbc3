"""Where bench messages live: a SQL queue table, a Kafka topic or a RabbitMQ queue.

Each place writes and reads with its raw driver (psycopg, sqlite3, aiokafka, pika), never
through the bridge's sources and sinks, so it can measure a leg alone, fill a source, watch a
destination, write at a paced rate, time each message to its destination, and move one message
per transaction (the baseline). Tables, topics and queues are created by the bridge's own
`install` (the layout users get) under unique names, and removed by `drop`. The transports are
built through `bridge.transports.load`, the product's public name table.
"""

from bench.legs.kafka import DEFAULT_PARTITIONS, KafkaPlace
from bench.legs.place import PG_DSN, RABBITMQ_URL, Place
from bench.legs.rabbitmq import RabbitPlace
from bench.legs.sql import SqlPlace

__all__ = [
    "DEFAULT_PARTITIONS",
    "PG_DSN",
    "RABBITMQ_URL",
    "KafkaPlace",
    "Place",
    "RabbitPlace",
    "SqlPlace",
]
