"""Each connection type's driver-free rules module, by type name.

A module has `ADDRESS_KEY` (a route end names a `queue` or a `topic`), `SOURCE_GROUP` (a source
reads in a consumer group), `lint(connection)` yielding (key, problem) pairs,
`address_problem(kind, name)` saying why a name would be refused, and `canonical_address` /
`address_key` for addresses as NServiceBus headers carry them, and `MAX_DELAY_SECONDS`, the
longest delay a destination of the type holds (None: it cannot delay a message).
"""

from __future__ import annotations

from types import ModuleType

from bridge.transports.kafka import config as kafka_config
from bridge.transports.rabbitmq import config as rabbitmq_config
from bridge.transports.sql import config as sql_config

__all__ = ["RULES"]

RULES: dict[str, ModuleType] = {
    kind: module for module in (sql_config, kafka_config, rabbitmq_config) for kind in module.KINDS
}
