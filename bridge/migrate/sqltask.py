"""One Spark task of a migration from a SQL queue table: its sequence range -> the destination.

The task opens the route's transports from the shipped config, a `SqlSource` restricted to
its range (`seq_range`: the destructive receive with `FOR UPDATE SKIP LOCKED` / `READPAST`,
the same commit, abort, expiry and poison handling as the service), and the destination the
service would use: a sink inside the source's transaction when both tables are in one
database, else the destination connection's own sink (SQL, Kafka, RabbitMQ). Then
`bounded.run_until_exhausted` moves the range.
"""

from __future__ import annotations

from bridge.errors import ConfigError
from bridge.migrate.bounded import Moved, run_task, run_until_exhausted
from bridge.migrate.spec import JobSpec
from bridge.protocols import Sink, Transport
from bridge.routing.rules import RouteRules
from bridge.transports import load
from bridge.transports.sql import Transport as SqlTransport

__all__ = ["move_range", "sql_task"]


def sql_task(spec: JobSpec, item: tuple[int, int, int]) -> Moved:
    """The Spark task function: `item` is (task index, lo, hi)."""
    index, lo, hi = item
    return run_task(spec.fail_after, index, lambda fail: move_range(spec, lo, hi, fail_after=fail))


async def move_range(spec: JobSpec, lo: int, hi: int, *, fail_after: int | None = None) -> Moved:
    """Move rows lo <= seq <= hi of the route's source table to its destination."""
    config, route = spec.load()
    source_name, sink_name = route.from_.connection, route.to.connection
    source_transport = load(source_name, config.connections[source_name])
    opened: list[Transport] = [source_transport]
    try:
        if not isinstance(source_transport, SqlTransport):
            raise ConfigError(f"route {route.name}: its source is not a SQL queue table")
        source = source_transport.source(
            route.from_.address, error_queue=route.error_queue_name, seq_range=(lo, hi)
        )
        sink: Sink
        if sink_name == source_name:
            sink = source.sink_in_transaction(route.to.address)
        else:
            sink_transport = load(sink_name, config.connections[sink_name])
            opened.append(sink_transport)
            sink = sink_transport.sink(route.to.address, key=route.key)
        rules = RouteRules(route, config.registry)
        return await run_until_exhausted(route, source, sink, fail_after=fail_after, rules=rules)
    finally:
        for transport in opened:
            await transport.close()
