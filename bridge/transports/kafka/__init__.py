"""Kafka topics through aiokafka: the transport is `transport.py`, its rules `config.py`.

Importing the package imports no driver (the config loader reads `config.py`); the names below
load their modules on first use.
"""

from bridge.transports import lazy_exports

__all__ = [
    "KafkaRangeSource",
    "KafkaSink",
    "KafkaSource",
    "Transport",
    "checkpoint_key",
    "checkpoint_prefix",
]

__getattr__ = lazy_exports(
    __name__,
    {
        "KafkaRangeSource": "range_source",
        "KafkaSink": "sink",
        "KafkaSource": "source",
        "Transport": "transport",
        "checkpoint_key": "source",
        "checkpoint_prefix": "source",
    },
)
