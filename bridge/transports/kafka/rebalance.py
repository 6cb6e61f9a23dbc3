"""What a Kafka source does when its group moves partitions.

When partitions are taken away while a batch is in hand, the revocation waits up to
`revoke_grace` seconds (at most half the session timeout) for the batch to settle, so a clean
hand-over commits first. A commit that still fails because the group moved on
(`CommitFailedError`, partition no longer assigned) is logged, not raised: the partition's next
owner receives those records again (duplicates only of what was in flight). With a checkpoint
store there are no duplicates: of the late batch and the next owner's (or, after an eager
rebalance gave the partition back, this consumer's own next batch from the stored position)
only the first to store its positions commits; the other's send rolls back (`PositionMoved`),
the runner aborts it, and an aborted batch's partitions load their stored positions again
before anything more is fetched from them.

Newly assigned partitions, with a checkpoint store, are paused before anything is fetched from
them and resume from their stored positions (`source.KafkaSource`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiokafka import ConsumerRebalanceListener, TopicPartition

__all__ = ["RebalanceListener"]

#: Called with the partitions the group took away or gave.
OnRebalance = Callable[[set[TopicPartition]], Awaitable[None]]


class RebalanceListener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
    """Hands aiokafka's rebalance callbacks to a source (aiokafka awaits them in its rebalance)."""

    def __init__(self, *, on_revoked: OnRebalance, on_assigned: OnRebalance) -> None:
        self._on_revoked = on_revoked
        self._on_assigned = on_assigned

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self._on_assigned(assigned)
