"""Delays for destinations that cannot delay (Kafka), through the `delays:` SQL connection.

A destination whose connection type has no delayed delivery (`MAX_DELAY_SECONDS` None: Kafka)
refuses a message asked to be delivered later (`bridge.nservicebus.delays.refuse_delays`),
unless the config names `delays: {connection: NAME}`: then its sink is a `DelayingSink`, which
stores such a message in that connection's `BridgeDelays` table
(`bridge.transports.sql.delay_table`) and sends the others on, and `bridge run` runs a
`DelayedProducer`, which sends each stored message to its destination when it is due and only
then deletes its row (a row that can never be sent goes to the error queue of the `delays:`
connection instead, `delay_table`). A delay waits at most `MAX_WAIT` seconds past its due
time (plus the send), whether or not the process that stored it still runs. A look that
finds a row due but takes none (another producer holds it) waits `MIN_WAIT` seconds before the
next, twice as long each time that repeats, up to `MAX_WAIT`, as the movers do: the producer
never polls in a loop. A destination whose send fails in a way that may pass (its Kafka
cluster down) backs off on its own, 1 s doubled each time in a row up to `MAX_BACKOFF`: its
rows are given back and left out of the takes meanwhile, so the delayed messages of the
others go out when due. Destinations are sent to one at a time: an attempt that fails only
when its request times out holds the others up for that long, once per back-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from functools import partial

from bridge.config.kinds import RULES
from bridge.config.models import BridgeConfig, DerivedRoute
from bridge.envelope import Envelope
from bridge.errors import (
    BridgeError,
    HeadersFormatError,
    MessageRejected,
    MessagesRejected,
)
from bridge.nservicebus.deadletter import DEFAULT_ERROR_QUEUE
from bridge.nservicebus.delays import DELAY_WITH_TTL, too_long
from bridge.protocols import Checkpoint, Sink, Transport
from bridge.service.movers import backoff, next_wait
from bridge.transports.sql.config import MAX_DELAY_SECONDS as SQL_MAX_DELAY
from bridge.transports.sql.connection import Connection
from bridge.transports.sql.delay_table import PUT_OFF, DelayRow, DelayTable
from bridge.transports.sql.delayed import MOVE_BATCH
from bridge.transports.sql.dialects.base import DbConnection
from bridge.transports.sql.transport import Transport as SqlTransport

__all__ = [
    "DelayedProducer",
    "DelayingSink",
    "delayed_producer",
    "delaying_sink",
    "longest_delay",
    "retry_queues",
    "waiting_delays",
]

log = logging.getLogger("bridge.delays")


def longest_delay(config: BridgeConfig, connection: str) -> int | None:
    """The longest delay a destination on `connection` can be given (None: none at all)."""
    longest: int | None = RULES[config.connections[connection].type].MAX_DELAY_SECONDS
    if longest is None and config.delays is not None:
        return SQL_MAX_DELAY
    return longest


def delaying_sink(
    config: BridgeConfig,
    connection: str,
    address: str,
    key: str | None,
    sink: Sink,
    transport: Callable[[str], Transport],
) -> Sink:
    """`sink` itself, or a `DelayingSink` around it where its destination cannot delay and
    the config names a `delays:` connection."""
    kind = config.connections[connection].type
    if config.delays is None or RULES[kind].MAX_DELAY_SECONDS is not None:
        return sink
    store = transport(config.delays.connection)
    assert isinstance(store, SqlTransport)
    return DelayingSink(sink, store, connection, address, key)


async def waiting_delays(
    config: BridgeConfig,
    connection: str,
    address: str,
    transport: Callable[[str], Transport],
) -> tuple[int, float | None] | None:
    """For `bridge peek`: how many delayed messages wait in `BridgeDelays` for a destination
    that cannot delay, and seconds until the first is due; None where none can wait there."""
    kind = config.connections[connection].type
    if config.delays is None or RULES[kind].MAX_DELAY_SECONDS is not None:
        return None
    store = transport(config.delays.connection)
    assert isinstance(store, SqlTransport)
    db = Connection(store.dialect, pool=store.pool)
    try:
        return await db.run(partial(DelayTable(store.dialect).waiting_for, connection, address))
    finally:
        await db.close()


def delayed_producer(
    config: BridgeConfig, transport: Callable[[str], Transport]
) -> DelayedProducer | None:
    """The producer of the config's `delays:` connection, None without one."""
    if config.delays is None:
        return None
    store = transport(config.delays.connection)
    assert isinstance(store, SqlTransport)
    return DelayedProducer(
        store,
        lambda name, address, key: transport(name).sink(address, key=key),
        error_queue=config.delays.error_queue,
        retry_to=retry_queues(config),
    )


def retry_queues(config: BridgeConfig) -> dict[tuple[str, str], str]:
    """For each destination that cannot delay (connection, address), the table of the
    `delays:` connection a route reads and forwards to it: the registry's proxy of the
    endpoint it is, else a written route's source. An error copy of `BridgeDelays` names it
    in `NServiceBus.FailedQ`, so a ServicePulse retry, sent to that table, crosses again
    (`delay_table`, "Where a retry goes")."""
    if config.delays is None:
        return {}
    found: dict[tuple[str, str], str] = {}
    derived_first = sorted(config.all_routes, key=lambda r: not isinstance(r, DerivedRoute))
    for route in derived_first:
        kind = config.connections[route.to.connection].type
        if route.publish or route.from_.connection != config.delays.connection:
            continue
        if RULES[kind].MAX_DELAY_SECONDS is None:
            found.setdefault((route.to.connection, route.to.address), route.from_.address)
    return found


class DelayingSink:
    """Sends the messages of a send that are due now through `inner`, then stores those due
    later in `BridgeDelays` (the module docstring): a send the runner repeats after a refusal
    or a failure stores them once."""

    def __init__(
        self, inner: Sink, store: SqlTransport, connection: str, address: str, key: str | None
    ) -> None:
        self._inner = inner
        self._table = DelayTable(store.dialect)
        self._db = Connection(store.dialect, pool=store.pool)
        self._to = (connection, address, key)

    async def send(
        self, envelopes: Sequence[Envelope], checkpoint: Checkpoint | None = None
    ) -> None:
        now = time.time()
        later: list[Sequence[object]] = []
        rest: list[int] = []
        for index, envelope in enumerate(envelopes):
            due = envelope.deliver_at
            if due is None or due <= now:
                rest.append(index)
                continue
            if envelope.expires_at is not None:
                raise MessageRejected(f"delays: {DELAY_WITH_TTL}", index=index)
            assert SQL_MAX_DELAY is not None
            longer = too_long(envelope, now, SQL_MAX_DELAY, "delays", index)
            if longer is not None:
                raise longer
            try:
                later.append(
                    self._table.store_params(envelope, round((due - now) * 1000), *self._to)
                )
            except HeadersFormatError as exc:
                raise MessageRejected(f"delays: {exc}", index=index) from exc
        # The rest first: a send that fails or refuses a message comes again with the delayed
        # messages in it, which must be stored once, after the rest went through.
        try:
            if rest or checkpoint:
                await self._inner.send([envelopes[i] for i in rest], checkpoint)
        except MessagesRejected as exc:
            mapped = [MessageRejected(str(r), _index(rest, r.index)) for r in exc.rejections]
            if exc.rest_accepted and later:  # not sent again: store the delayed ones now
                await self._db.run(partial(self._store, later))
            raise MessagesRejected(mapped, rest_accepted=exc.rest_accepted) from exc
        except MessageRejected as exc:
            raise MessageRejected(str(exc), _index(rest, exc.index)) from exc
        if later:
            await self._db.run(partial(self._store, later))

    def _store(self, rows: list[Sequence[object]], db: DbConnection) -> None:
        self._table.dialect.begin(db)
        db.cursor().executemany(self._table.store, rows)
        db.commit()

    async def close(self) -> None:
        await self._inner.close()
        await self._db.close()


def _index(positions: list[int], index: int | None) -> int | None:
    return None if index is None else positions[index]


class DelayedProducer:
    """Sends the due rows of `BridgeDelays` on `store` to their destinations (a batch at a
    time: sent, then deleted, in one transaction of the table; SQLite: claimed, sent, then
    deleted, `delay_table`); see the module docstring."""

    def __init__(
        self,
        store: SqlTransport,
        sink: Callable[[str, str, str | None], Sink],
        batch: int = MOVE_BATCH,
        error_queue: str = DEFAULT_ERROR_QUEUE,
        retry_to: dict[tuple[str, str], str] | None = None,
    ) -> None:
        self.store = store
        self._sink = sink
        self._sinks: dict[tuple[str, str, str | None], Sink] = {}
        self.batch = batch
        self.table = DelayTable(store.dialect, error_queue, retry_to)
        #: Error copies that could not be written since start (rows left in BridgeDelays).
        self.uncopied = 0
        #: Destinations (connection, address) whose send failed in a way that may pass: how
        #: many times in a row, and until when (`time.monotonic`) their rows are left alone.
        self.backing_off: dict[tuple[str, str], tuple[int, float]] = {}

    async def run(self, stopping: asyncio.Event) -> None:
        db = Connection(self.store.dialect, pool=self.store.pool)
        failures = 0
        stalls = 0  # looks in a row that found a row due and took none
        try:
            while not stopping.is_set():
                try:
                    skip = self._skipped()
                    if await self._produce_due(db, skip):
                        failures = stalls = 0
                        await asyncio.sleep(0)
                        continue
                    next_due = await db.run(partial(self.table.seconds_to_next_due, skip=skip))
                    failures = 0
                    stalls = stalls + 1 if next_due is not None and next_due <= 0 else 0
                    # Due rows another producer holds (stalls): look again after a while.
                    wait = next_wait(next_due, stalls)
                    if skip:  # a destination backing off may be due again before that
                        wait = min(wait, self._until_back() - time.monotonic())
                except BridgeError as exc:
                    stalls = 0
                    failures += 1
                    wait = backoff(failures)
                    log.warning(
                        "sending due delayed messages failed (again in %.0f s): %s", wait, exc
                    )
                if wait > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stopping.wait(), timeout=wait)
        finally:
            for sink in self._sinks.values():
                await sink.close()
            await db.close()

    def _skipped(self) -> list[tuple[str, str]]:
        """The destinations backing off now (`backing_off`)."""
        now = time.monotonic()
        return [to for to, (_, until) in self.backing_off.items() if until > now]

    def _until_back(self) -> float:
        """When the first destination backing off is tried again (`time.monotonic`)."""
        now = time.monotonic()
        return min((until for _, until in self.backing_off.values() if until > now), default=now)

    def _back_off(self, to: tuple[str, str], exc: BaseException) -> None:
        """`to` failed in a way that may pass: its rows are left alone for a while, twice as
        long each time in a row (as a route backs off), while the others go out on time."""
        failures = self.backing_off.get(to, (0, 0.0))[0] + 1
        wait = backoff(failures)
        self.backing_off[to] = (failures, time.monotonic() + wait)
        log.warning(
            "sending delayed messages to %s/%s failed (again in %.0f s; those of other "
            "destinations go on): %s",
            to[0],
            to[1],
            wait,
            exc,
        )

    async def _produce_due(self, db: Connection, skip: Sequence[tuple[str, str]] = ()) -> bool:
        """Send the due rows of one destination (of a batch taken in due order) and delete
        them, in their own transaction (SQLite: claimed first, `delay_table`); whether there
        were any.

        A row that can never be sent (its destination refuses it for good, a record too large;
        a connection the config no longer names; Headers that cannot be read) goes to the
        error queue of the `delays:` connection with the reason, logged as an error, and the
        others are sent: it never holds up the rows behind it, nor makes them go out again,
        also when its error copy cannot be written (the rows sent are deleted first; it stays,
        put off, `_to_error_queue`). A failure that may pass before the deletes rolls
        everything back (sent again: at least once). A send that fails in a way that may pass
        (the destination's broker down) gives the rows back and puts that destination in
        `backing_off`: the next takes leave its rows out (`skip`), so the rows of the other
        destinations go out when due.
        """
        taken = await db.run(partial(self.table.take_due, self.batch, skip=skip))
        if not taken:
            return False
        to = (taken[0].connection, taken[0].address, taken[0].key)
        failed = {i: row.unreadable[1] for i, row in enumerate(taken) if row.unreadable}
        readable = [i for i in range(len(taken)) if i not in failed]
        try:
            refused = await self._send(to, [taken[i] for i in readable])
        except BridgeError as exc:  # may pass: this destination backs off, the others go on
            await self._give_back(db, taken)
            self._back_off(to[:2], exc)
            return True
        except BaseException:
            await self._give_back(db, taken)
            raise
        self.backing_off.pop(to[:2], None)
        failed |= {readable[i]: reason for i, reason in refused.items()}
        sent = [row.id for i, row in enumerate(taken) if i not in failed]
        errors = [(taken[i], failed[i]) for i in sorted(failed)]
        try:
            await db.run(partial(self.table.settle, sent, errors))
        except BaseException:
            with contextlib.suppress(BridgeError):
                await db.run(_roll_back)
            raise
        for row, reason in errors:
            await self._to_error_queue(db, row, reason)
        return True

    async def _to_error_queue(self, db: Connection, row: DelayRow, reason: str) -> None:
        """Write the error copy of a row that can never be sent (`settle` deleted the rows
        sent with it and put this one off); one that cannot be written stays, due again in
        `PUT_OFF` seconds, logged and counted (`uncopied`)."""
        where = f"{self.table.error_queue!r} on connection {self.store.name!r}"
        try:
            await db.run(partial(self.table.copy_to_error_queue, row, reason))
        except BridgeError as exc:
            self.uncopied += 1
            log.error(
                "delayed message %s (BridgeDelays row %s) to %s/%s can never be sent (%s), and "
                "its error copy cannot be written to %s: %s; the row stays in BridgeDelays and "
                "its copy is tried again in %d s (%d such failure(s) so far)",
                row.envelope.message_id,
                row.id,
                row.connection,
                row.address,
                reason,
                where,
                exc,
                PUT_OFF,
                self.uncopied,
            )
            return
        log.error(
            "delayed message %s (BridgeDelays row %s) to %s/%s can never be sent: %s; it "
            "went to %s",
            row.envelope.message_id,
            row.id,
            row.connection,
            row.address,
            reason,
            where,
        )

    async def _give_back(self, db: Connection, rows: list[DelayRow]) -> None:
        """The rows taken are due again as they were; a failure here leaves a SQLite claim to
        run out (`delay_table.CLAIM_FOR`)."""
        try:
            await db.run(partial(self.table.give_back, rows))
        except BridgeError as exc:
            log.warning("giving back %d delayed message(s) taken failed: %s", len(rows), exc)

    async def _send(self, to: tuple[str, str, str | None], rows: list[DelayRow]) -> dict[int, str]:
        """Send `rows` to `to`; the indexes of those refused for good, with the reason."""
        if not rows:
            return {}
        sink = self._sinks.get(to)
        if sink is None:
            try:
                sink = self._sinks[to] = self._sink(*to)
            except KeyError:  # a row stored under a config that had the connection
                reason = f"the config names no connection {to[0]!r}"
                return dict.fromkeys(range(len(rows)), reason)
        pending = list(range(len(rows)))
        refused: dict[int, str] = {}
        while pending:
            try:
                await sink.send([rows[i].envelope for i in pending])
                return refused
            except MessagesRejected as exc:
                named = {pending[r.index]: str(r) for r in exc.rejections if r.index is not None}
                if not named:
                    raise
                refused |= named
                if exc.rest_accepted:
                    return refused
                pending = [i for i in pending if i not in named]
            except MessageRejected as exc:
                if exc.index is None:
                    if len(pending) > 1:  # which one: each alone
                        for i in list(pending):
                            why = await self._send_one(sink, rows[i])
                            if why is not None:
                                refused[i] = why
                        return refused
                    index = pending[0]
                else:
                    index = pending[exc.index]
                refused[index] = str(exc)
                pending = [i for i in pending if i != index]
        return refused

    @staticmethod
    async def _send_one(sink: Sink, row: DelayRow) -> str | None:
        """Send one row; why it was refused for good, None when it was sent."""
        try:
            await sink.send([row.envelope])
            return None
        except MessageRejected as exc:
            return str(exc)


def _roll_back(db: DbConnection) -> None:
    db.rollback()
