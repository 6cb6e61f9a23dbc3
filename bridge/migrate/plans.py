"""How `bridge migrate` splits a route's backlog into tasks, per kind of source.

`SqlPlan` (SQL queue table -> anything): the table's lowest and highest sequence number, split
into `partitions` ranges; one `sqltask.sql_task` per range. Progress: rows of the planned range
no longer in the table (received by the job, or by the service next to it).

`KafkaPlan` (Kafka topic -> SQL queue table): per partition, from the position stored in the
destination's `BridgeCheckpoints` under the service's name (`group/topic/partition`), else the
earliest offset, up to the end offset now; one `kafkatask.kafka_task` per partition with
records left (`partitions` does not apply). Progress: the stored positions.

`check` also verifies what `bridge check --connect` would for the route (tables and topics
exist) and reads the extent; `planned` is 0 when there is nothing to move.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bridge.config.models import SQL_TYPES, BridgeConfig, Route
from bridge.errors import ConfigError
from bridge.migrate.bounded import Moved
from bridge.migrate.ranges import split
from bridge.migrate.spec import JobSpec
from bridge.protocols import Transport
from bridge.transports import load

__all__ = ["KafkaPlan", "Plan", "SqlPlan", "plan_for"]


class Plan:
    """What differs between the two kinds of route (see the module docstring)."""

    #: The Spark task function, called with (spec, item).
    task: Callable[[JobSpec, Any], Moved]
    planned: int = 0

    async def check(self) -> None:
        raise NotImplementedError

    def items(self, partitions: int) -> list[Any]:
        raise NotImplementedError

    async def done(self) -> int:
        """How many of `planned` have left the source so far."""
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class SqlPlan(Plan):
    def __init__(self, config: BridgeConfig, route: Route) -> None:
        from bridge.migrate.sqltask import sql_task
        from bridge.transports.sql import Transport as SqlTransport

        self.task = sql_task
        self._route = route
        source = load(route.from_.connection, config.connections[route.from_.connection])
        assert isinstance(source, SqlTransport)
        self._source = source
        self._sink: Transport | None = None
        if route.to.connection != route.from_.connection:
            self._sink = load(route.to.connection, config.connections[route.to.connection])
        self._bounds: tuple[int, int] | None = None

    async def check(self) -> None:
        route = self._route
        if self._sink is None:
            await self._source.check(
                [route.from_.address, route.error_queue_name, route.to.address]
            )
        else:
            await self._source.check([route.from_.address, route.error_queue_name])
            await self._sink.check([route.to.address])
        self._bounds = await self._source.bounds(route.from_.address)
        if self._bounds is not None:
            self.planned = await self._source.count_range(route.from_.address, *self._bounds)

    def items(self, partitions: int) -> list[tuple[int, int, int]]:
        if self._bounds is None:
            return []
        return [(i, lo, hi) for i, (lo, hi) in enumerate(split(*self._bounds, partitions))]

    async def done(self) -> int:
        if self._bounds is None:
            return 0
        left = await self._source.count_range(self._route.from_.address, *self._bounds)
        return self.planned - left

    async def close(self) -> None:
        await self._source.close()
        if self._sink is not None:
            await self._sink.close()


class KafkaPlan(Plan):
    def __init__(self, config: BridgeConfig, route: Route) -> None:
        from bridge.migrate.kafkatask import kafka_task
        from bridge.transports.kafka import Transport as KafkaTransport
        from bridge.transports.kafka import checkpoint_key, checkpoint_prefix
        from bridge.transports.sql import SqlSink

        self.task = kafka_task
        self._route = route
        kafka = load(route.from_.connection, config.connections[route.from_.connection])
        assert isinstance(kafka, KafkaTransport)
        self._kafka = kafka
        self._sql = load(route.to.connection, config.connections[route.to.connection])
        sink = self._sql.sink(route.to.address)
        assert isinstance(sink, SqlSink)
        self._sink = sink
        group, topic = str(route.from_.group), route.from_.address
        self._key: Callable[[int], str] = lambda partition: checkpoint_key(group, topic, partition)
        self._prefix = checkpoint_prefix(group, topic)
        self._ranges: list[tuple[int, int, int]] = []

    async def check(self) -> None:
        route = self._route
        await self._kafka.check([route.from_.address, route.error_queue_name])
        await self._sql.check([route.to.address])
        offsets = await self._kafka.partition_offsets(route.from_.address)
        stored = await self._sink.load_checkpoint(self._prefix)
        for partition, (begin, end) in sorted(offsets.items()):
            start = max(begin, stored.get(self._key(partition), begin))
            if start < end:
                self._ranges.append((partition, start, end))
        self.planned = sum(end - start for _, start, end in self._ranges)

    def items(self, partitions: int) -> list[tuple[int, int, int, int]]:
        return [(i, *r) for i, r in enumerate(self._ranges)]

    async def done(self) -> int:
        stored = await self._sink.load_checkpoint(self._prefix)
        return sum(
            min(max(stored.get(self._key(p), start), start), end) - start
            for p, start, end in self._ranges
        )

    async def close(self) -> None:
        await self._sink.close()
        await self._kafka.close()
        await self._sql.close()


def plan_for(config: BridgeConfig, route: Route) -> Plan:
    kinds = (
        config.connections[route.from_.connection].type,
        config.connections[route.to.connection].type,
    )
    if kinds[0] in SQL_TYPES:
        return SqlPlan(config, route)
    if kinds[0] == "kafka" and kinds[1] in SQL_TYPES:
        return KafkaPlan(config, route)
    raise ConfigError(
        f"route {route.name} goes {kinds[0]} -> {kinds[1]}: bridge migrate moves routes from a "
        "SQL queue table, and from a Kafka topic into a SQL queue table; "
        "`bridge run --until-idle` moves the others"
    )
