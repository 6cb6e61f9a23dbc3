"""One Spark task of a migration from a Kafka topic: a partition's offset range -> SQL.

The task reads one partition from `start` up to (not including) `end` with the Kafka
transport's range source (`Transport.source(..., offsets=(partition, start, end))`: no group
membership, no Kafka commits), whose batches carry the partition's next offset under the
service's name for it (`checkpoint_key`). The destination, a SQL queue table's `SqlSink`,
stores that position in the same transaction as the rows, so the move is exactly-once: a
retried task starts from the stored position, not from where the driver planned, and a second
run finds nothing left. Poison records and messages the destination refused for good go to the
route's error topic, as the service does. Records at or past `end` are left to the service.

Two attempts of one task may run at once (Spark speculation, or a zombie attempt on an
executor the driver gave up on). The sink's checkpoint writes are fenced
(`SqlSink.fence_checkpoint`): each stores the partition's position only over the one the
attempt read at its start, then over its own last one. The attempt that finds another's
position there rolls back its batch and fails with `RangeTakenOver`, which is not retried
within the task; the rows are written once. A position there that this attempt wrote itself,
in a send whose COMMIT answer was lost (the sink's `unsure_checkpoint`), is no takeover: the
attempt goes on from it.
"""

from __future__ import annotations

from bridge.errors import ConfigError, TransportError
from bridge.migrate.bounded import Moved, run_task, run_until_exhausted
from bridge.migrate.spec import JobSpec
from bridge.routing.rules import RouteRules
from bridge.transports import load
from bridge.transports.kafka import Transport as KafkaTransport
from bridge.transports.kafka import checkpoint_key, checkpoint_prefix
from bridge.transports.sql import CheckpointConflict, SqlSink

__all__ = ["RangeTakenOver", "kafka_task", "move_partition"]


class RangeTakenOver(TransportError):
    """Another attempt of this task stored the partition's position first (not retriable)."""


async def move_partition(
    spec: JobSpec, partition: int, start: int, end: int, *, fail_after: int | None = None
) -> Moved:
    """Move offsets start..end-1 of one partition of the route's topic into its SQL table,
    resuming from the position stored with the rows when that is further on."""
    config, route = spec.load()
    source_name, sink_name = route.from_.connection, route.to.connection
    kafka = load(source_name, config.connections[source_name])
    sql = load(sink_name, config.connections[sink_name])
    try:
        if not isinstance(kafka, KafkaTransport) or route.from_.group is None:
            raise ConfigError(f"route {route.name}: its source is not a Kafka topic and group")
        topic, group = route.from_.address, route.from_.group
        key = checkpoint_key(group, topic, partition)
        rules = RouteRules(route, config.registry)
        own: int | None = None  # a position this attempt may have stored without learning it
        while True:
            sink = sql.sink(route.to.address)
            if not isinstance(sink, SqlSink):
                raise ConfigError(f"route {route.name}: its destination is not a SQL queue table")
            stored = (await sink.load_checkpoint(checkpoint_prefix(group, topic))).get(key)
            if own is not None and stored != own:
                raise _taken_over(topic, partition, start, end)
            sink.fence_checkpoint({key: stored})
            source = kafka.source(
                topic,
                group=group,
                error_queue=route.error_queue_name,
                offsets=(partition, start if stored is None else max(start, stored), end),
            )
            try:
                return await run_until_exhausted(
                    route, source, sink, fail_after=fail_after, rules=rules
                )
            except CheckpointConflict:
                # The stored position is another attempt's, or this one's own from a send
                # whose COMMIT answer was lost (then it goes on from there).
                own = sink.unsure_checkpoint().get(key)
                if own is None:
                    raise _taken_over(topic, partition, start, end) from None
    finally:
        await kafka.close()
        await sql.close()


def _taken_over(topic: str, partition: int, start: int, end: int) -> RangeTakenOver:
    return RangeTakenOver(
        f"{topic}/{partition}: another attempt moved this range (offsets {start} to "
        f"{end - 1}) while this one ran; this attempt rolled back its batch"
    )


def kafka_task(spec: JobSpec, item: tuple[int, int, int, int]) -> Moved:
    """The Spark task function: `item` is (task index, partition, start offset, end offset)."""
    index, partition, start, end = item
    return run_task(
        spec.fail_after,
        index,
        lambda fail: move_partition(spec, partition, start, end, fail_after=fail),
    )
