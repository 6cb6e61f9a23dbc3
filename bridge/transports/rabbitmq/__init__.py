"""RabbitMQ queues through pika: the transport is `transport.py`, its rules `config.py`.

Importing the package imports no driver (the config loader reads `config.py`); the names below
load their modules on first use.
"""

from bridge.transports import lazy_exports

__all__ = ["RabbitMQSink", "RabbitMQSource", "Transport"]

__getattr__ = lazy_exports(
    __name__,
    {
        "RabbitMQSink": "sink",
        "RabbitMQSource": "source",
        "Transport": "transport",
    },
)
