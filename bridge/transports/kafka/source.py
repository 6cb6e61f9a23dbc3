"""Kafka source: one consumer in the route's group, settled a batch at a time.

Guarantees
    At least once. A batch's records are committed (the next offset of each partition it holds)
    only by `commit()`, which the runner calls after the sink made them durable; `abort()` seeks
    every partition of the batch back to its first record, so the same records come again, in
    order. `batch.checkpoint` is {"group/topic/partition": next offset} for the partitions in the
    batch. With a `checkpoint_store` (a destination that stores those positions with its rows),
    every newly assigned partition starts from its stored position instead of the committed
    offset, which makes Kafka -> SQL exactly-once even when Kafka commits lag or fail. Until the
    stored positions are loaded, the new partitions stay paused, so nothing is fetched from the
    wrong place. The checkpoint is then a `FencedCheckpoint`: it also carries the position each
    partition's batch started from (the stored one this consumer read or wrote last, None when
    there was none), and the destination stores a position only over that one. With a store the
    group's offsets only report progress (lag, tools), so `commit()` hands them to a commit that
    runs behind the next batches (one at a time, in order, each with every partition's latest
    position; `close()` waits for the last) instead of waiting a broker round trip, so a broker
    that does not answer holds no batch up; without one, `commit()` returns once the group
    committed.

Rebalancing
    A revocation waits (`revoke_grace`) for the batch in hand to settle; newly assigned
    partitions wait, paused, for their stored positions. See `rebalance.py`.

Poison and expiry
    A record whose headers are not UTF-8 is a `PoisonMessage` in `batch.poison`; before the batch
    is handed out, its copy (key, value and headers byte for byte plus the NServiceBus failure
    headers) is written to `error_queue` (a topic on this connection, `bridge.error` by default),
    once per record per source even when the batch is aborted and received again. Expired
    records are not dropped here: `expires_at` is set and the runner drops them.

Errors
    Broker unreachable, timeouts and coordinator moves raise `TransportUnavailable`; a commit
    retried by aiokafka for longer than the request timeout does too. One batch is in hand at a
    time: receiving again before settling the last batch is a usage error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError

from bridge.batch import Batch, Rejected
from bridge.errors import SettleError
from bridge.protocols import Checkpoint, CheckpointStore, FencedCheckpoint
from bridge.transports.kafka.deadletter import ErrorQueue
from bridge.transports.kafka.errors import DRIVER_ERRORS, translate, translated
from bridge.transports.kafka.headers import read_records
from bridge.transports.kafka.producer import ProducerFactory
from bridge.transports.kafka.rebalance import RebalanceListener

__all__ = ["KafkaSource", "checkpoint_key"]

log = logging.getLogger("bridge.kafka")


def checkpoint_prefix(group: str, topic: str) -> str:
    """What every stored position of `group` on `topic` starts with."""
    return f"{group}/{topic}/"


def checkpoint_key(group: str, topic: str, partition: int) -> str:
    """The name a destination stores `group`'s position in one partition of `topic` under."""
    return f"{checkpoint_prefix(group, topic)}{partition}"


class KafkaSource:
    #: Longest wait of a revocation for the batch in hand to settle (see `revoke_grace`).
    REVOKE_GRACE = 5.0

    def __init__(
        self,
        *,
        topic: str,
        group: str,
        consumer_kwargs: dict[str, Any],
        producer: ProducerFactory,
        error_queue: str,
        max_request_size: int,
        checkpoint_store: CheckpointStore | None = None,
    ) -> None:
        self.topic = topic
        self.group = group
        self.error_queue = error_queue
        self._consumer_kwargs = consumer_kwargs
        self._store = checkpoint_store
        self._consumer: Any = None  # AIOKafkaConsumer, started on first receive
        self._unpositioned: set[TopicPartition] = set()  # waiting for their stored position
        # With a store: the stored position each partition's next batch starts from (None: none)
        self._expected: dict[TopicPartition, int | None] = {}
        #: Seconds a revocation waits for the batch in hand to settle: below the rebalance
        #: timeout, so a member holding a batch is not dropped from the group for it.
        self.revoke_grace = min(
            self.REVOKE_GRACE, consumer_kwargs.get("session_timeout_ms", 10_000) / 2000
        )
        self._in_hand: asyncio.Event | None = None  # set once the batch in hand is settled
        self._behind: asyncio.Task[None] | None = None  # the commit behind the batches, if any
        self._unsent: dict[TopicPartition, int] = {}  # positions for the commit behind to send
        self._errors = ErrorQueue(producer, error_queue, topic, max_request_size)
        self._joined = False  # the group gave this consumer its (possibly empty) assignment
        self._drained = False
        self._drained_checked = 0.0

    @property
    def ready(self) -> bool:
        """Whether the last empty receive meant an empty topic for the whole group.

        A consumer that joined may still hold only some partitions (the rest wait for a dead
        member's session to expire), so every partition must have reached its end offset: by
        this consumer's position where it holds the partition, else by the group's committed
        offset or the destination's stored position. (tansu reports the end offset of a
        multi-record batch short, so there this is a little optimistic.)
        """
        return self._joined and not self._unpositioned and self._drained

    async def _check_drained(self, every: float = 1.0) -> None:
        now = time.monotonic()
        consumer = self._consumer
        if consumer is None or not self._joined or now - self._drained_checked < every:
            return
        self._drained_checked = now
        partitions = [
            TopicPartition(self.topic, p) for p in consumer.partitions_for_topic(self.topic) or ()
        ]
        if not partitions:
            self._drained = False
            return
        ends = await consumer.end_offsets(partitions)
        assigned = consumer.assignment()
        stored = (
            await self._store.load_checkpoint(checkpoint_prefix(self.group, self.topic))
            if self._store
            else {}
        )
        for tp in partitions:
            if tp in assigned:
                position = await consumer.position(tp)
            else:
                committed = await consumer.committed(tp) or 0
                key = checkpoint_key(self.group, tp.topic, tp.partition)
                position = max(committed, stored.get(key, 0))
            if position < ends[tp]:
                self._drained = False
                return
        self._drained = True

    @property
    def partitions(self) -> frozenset[TopicPartition]:
        """The partitions the group gave this source (none before its first receive)."""
        return frozenset(self._consumer.assignment()) if self._consumer is not None else frozenset()

    async def receive_batch(self, max_messages: int, timeout: float) -> Batch:
        if self._in_hand is not None and not self._in_hand.is_set():
            raise SettleError("settle the batch in hand before receiving the next one")
        consumer = await self._started()
        await self._seek_to_checkpoints()
        with translated(f"receive from topic {self.topic!r}"):
            fetched = await consumer.getmany(
                timeout_ms=max(0, int(timeout * 1000)), max_records=max_messages
            )
        records = [r for partition_records in fetched.values() for r in partition_records]
        if not records:
            with translated(f"read the end offsets of topic {self.topic!r}"):
                await self._check_drained()
            return Batch()
        self._drained = False
        # getmany returns each partition's records in offset order
        first = {tp: rs[0].offset for tp, rs in fetched.items() if rs}
        after = {tp: rs[-1].offset + 1 for tp, rs in fetched.items() if rs}
        checkpoint = self._checkpoint(after)
        messages, poison = read_records(records)
        try:
            await self._errors.copy_poison(poison)
        except BaseException:
            self._rewind(first, checkpoint)
            raise
        settled = self._in_hand = asyncio.Event()
        rejected: list[Rejected] = []

        async def commit() -> None:
            try:
                if rejected:
                    try:
                        await self._errors.dead_letter(rejected)
                    except BaseException:
                        self._rewind(first, checkpoint)  # not delivered: receive them again
                        raise
                await self._commit(after)
            finally:
                settled.set()

        async def abort() -> None:
            self._rewind(first, checkpoint)
            settled.set()

        return Batch(
            messages,
            poison=[copy for _, copy in poison],
            checkpoint=checkpoint,
            on_commit=commit,
            on_abort=abort,
            rejected=rejected,
        )

    def _checkpoint(self, after: dict[TopicPartition, int]) -> Checkpoint:
        """The batch's positions; with a store, fenced on where each partition's batch started,
        which is also where its next batch starts."""
        positions = {
            checkpoint_key(self.group, tp.topic, tp.partition): n for tp, n in after.items()
        }
        if self._store is None:
            return positions
        expected = {
            checkpoint_key(self.group, tp.topic, tp.partition): self._expected.get(tp)
            for tp in after
        }
        self._expected.update(after)
        return FencedCheckpoint(positions, expected)

    async def close(self) -> None:
        behind, self._behind = self._behind, None
        if behind is not None:
            await behind  # the last positions reach the group before the consumer leaves
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with translated(f"close the consumer of group {self.group!r}"):
                await consumer.stop()

    async def _started(self) -> Any:
        if self._consumer is None:
            consumer = AIOKafkaConsumer(**self._consumer_kwargs)
            try:
                with translated(f"start a consumer for topic {self.topic!r}"):
                    await consumer.start()
                    listener = RebalanceListener(  # the handlers are looked up at each call
                        on_revoked=lambda revoked: self._on_revoked(revoked),
                        on_assigned=lambda assigned: self._on_assigned(assigned),
                    )
                    consumer.subscribe([self.topic], listener=listener)
            except BaseException:
                await consumer.stop()
                raise
            self._consumer = consumer
        return self._consumer

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        consumer = self._consumer
        assigned = consumer.assignment() if consumer is not None else set()
        owned = {tp: n for tp, n in offsets.items() if tp in assigned}
        if len(owned) < len(offsets):
            self._handed_over(offsets.keys() - owned.keys(), "no longer assigned")
        if not owned:
            return
        if self._store is None:
            await self._commit_offsets(owned)
            return
        # The destination stored these positions with the rows, and a partition resumes from
        # there: the group's offsets only say how far it got (lag, tools). So the commit runs
        # behind the next batches instead of costing each batch a broker round trip: at most
        # one is in flight, and what batches settle meanwhile waits for it, only each
        # partition's latest position, never the batch itself (a broker that does not answer
        # would hold every batch up to `request_timeout_ms`).
        self._unsent.update(owned)
        if self._behind is None or self._behind.done():
            self._behind = asyncio.create_task(self._commit_behind())

    async def _commit_behind(self) -> None:
        while self._unsent and self._consumer is not None:
            assigned = self._consumer.assignment()
            owned = {tp: n for tp, n in self._unsent.items() if tp in assigned}
            self._unsent = {}
            if not owned:
                continue
            try:
                await self._commit_offsets(owned)
            except Exception as exc:  # the next commit carries later positions
                log.info("group %s: offsets not committed: %s", self.group, exc)

    async def _commit_offsets(self, owned: dict[TopicPartition, int]) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        timeout = self._consumer_kwargs.get("request_timeout_ms", 40_000) / 1000
        try:
            await asyncio.wait_for(consumer.commit(owned), timeout)
        except (CommitFailedError, IllegalStateError) as exc:
            self._handed_over(owned, str(exc))
            return
        except DRIVER_ERRORS as exc:
            raise translate(exc, f"commit offsets of group {self.group!r}") from exc
        self._errors.forget(lambda tp, offset: offset >= owned.get(tp, 0))

    def _handed_over(self, partitions: Iterable[TopicPartition], why: str) -> None:
        names = ", ".join(sorted(f"{tp.topic}/{tp.partition}" for tp in partitions))
        if self._store is not None:
            log.info(
                "group %s: not committed (%s): %s; the destination holds the position",
                self.group,
                why,
                names,
            )
        else:
            log.warning(
                "group %s: not committed (%s): %s; their next owner receives the "
                "batch in hand again",
                self.group,
                why,
                names,
            )

    def _rewind(self, first: dict[TopicPartition, int], checkpoint: Checkpoint) -> None:
        """Receive the batch's records again: from its first records, or with a store from the
        stored positions (loaded again first: another consumer may have moved them)."""
        consumer = self._consumer
        if consumer is None:
            return
        assigned = consumer.assignment()
        rewound = [tp for tp in first if tp in assigned]  # a revoked one restarts elsewhere
        for tp in rewound:
            consumer.seek(tp, first[tp])
        if isinstance(checkpoint, FencedCheckpoint) and rewound:
            consumer.pause(*rewound)
            self._unpositioned.update(rewound)
            for tp in rewound:
                key = checkpoint_key(self.group, tp.topic, tp.partition)
                self._expected[tp] = checkpoint.expected.get(key)

    async def _seek_to_checkpoints(self) -> None:
        """Move partitions waiting for their stored position there, then let them fetch."""
        consumer = self._consumer
        if self._store is None or consumer is None or not self._unpositioned:
            return
        self._unpositioned &= consumer.assignment()
        waiting = set(self._unpositioned)
        if not waiting:
            return
        stored = await self._store.load_checkpoint(checkpoint_prefix(self.group, self.topic))
        # only those still waiting and still assigned (a rebalance may run meanwhile)
        waiting &= self._unpositioned & consumer.assignment()
        for tp in waiting:
            offset = stored.get(checkpoint_key(self.group, tp.topic, tp.partition))
            if offset is not None:
                consumer.seek(tp, offset)
                started = self._expected.get(tp)  # where the batch given back began
                if started is not None and offset != started:
                    # The batch was stored after all (its commit's answer was lost), or another
                    # consumer moved on: either way not read twice.
                    log.info(
                        "group %s: %s/%d resumes at %d, the position the destination stored, "
                        "not at %d",
                        self.group,
                        tp.topic,
                        tp.partition,
                        offset,
                        started,
                    )
            self._expected[tp] = offset
        consumer.resume(*waiting)
        self._unpositioned -= waiting

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        self._joined = True
        if self._store is None or self._consumer is None or not assigned:
            return
        self._consumer.pause(*assigned)  # before any await: nothing fetched from the wrong place
        self._unpositioned |= assigned
        try:
            await self._seek_to_checkpoints()
        except Exception as exc:  # retried before the next fetch; the partitions stay paused
            log.warning("group %s: loading stored positions failed: %s", self.group, exc)

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        self._errors.forget(lambda tp, _: tp not in revoked)
        for tp in revoked:
            self._expected.pop(tp, None)
        settled = self._in_hand
        if not revoked or settled is None or settled.is_set():
            return
        try:
            await asyncio.wait_for(settled.wait(), self.revoke_grace)
        except TimeoutError:
            log.warning("group %s: partitions revoked while a batch is in hand", self.group)
