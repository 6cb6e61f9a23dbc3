"""bridge: at-least-once bridge between NServiceBus SQL queue tables, Kafka and RabbitMQ."""

__all__ = ["__version__"]

__version__ = "0.1.0"
