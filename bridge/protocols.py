"""The contracts between the runner and the transports.

Source
    `receive_batch(max_messages, timeout)` waits up to `timeout` seconds for work and returns a
    `ReceivedBatch` (possibly empty). The messages stay at the source until the batch is
    committed: a crash, an `abort()` or leaving the `async with` block without `commit()`
    returns every one of them.

ReceivedBatch
    `messages` (forwardable), `poison` (never forwardable as is, kept byte for byte),
    `expired` (how many expired messages the receive dropped: they leave with the commit).
    `checkpoint` is an opaque source position (Kafka offsets) that a sink supporting
    transactional checkpoints stores with the rows; a `FencedCheckpoint` also says where each
    position stood when the batch was received, and such a sink stores it only over that one.
    Settling twice raises `SettleError`. A `commit()` that raises has left every message of
    the batch at the source (the batch is then settled as failed: nothing may settle it again).
    `reject(envelope, error)` marks a message refused for good: at commit the source moves it
    to its error queue (see bridge/nservicebus/deadletter.py for the copy), in the same
    transaction where the source has one.

Sink
    `send(envelopes, checkpoint)` returns only once the destination has durably accepted every
    envelope (SQL commit, Kafka acks=all, RabbitMQ publisher confirm). It raises
    `TransportUnavailable` (retriable) or `MessageRejected` (one message refused for good, with
    its index, or None when the destination does not say which: the runner then sends each
    message alone; `MessagesRejected` names several, and says whether the destination accepted
    the others of the call) and never swallows a write failure.

Optional capabilities of a source (the runner checks them with `isinstance`)
    `Readiness`: `ready` says whether the last empty receive meant an empty source; a Kafka
    consumer still joining its group, or holding only some partitions of a topic that is not
    drained, is not ready. A source without it is ready once a receive returned.
    `ReceivesAhead`: while `receives_ahead` is true the source may hold one more batch while
    one is in hand (an SQL queue table: a second connection, or the open SQLite transaction);
    the runner then receives the next batch while it sends the current one.

Optional capability of a transport
    `ConnectionLimit`: a server that limits connections (PostgreSQL, SQL Server) and what the
    routes of one process could hold there; `bridge check --connect` compares the two.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, runtime_checkable

from bridge.envelope import Envelope, PoisonMessage

__all__ = [
    "Checkpoint",
    "CheckpointStore",
    "ConnectionLimit",
    "FencedCheckpoint",
    "GroupLag",
    "PreparesSources",
    "QueueStats",
    "Readiness",
    "ReadsOldestAge",
    "ReceivedBatch",
    "ReceivesAhead",
    "ServerConnections",
    "SharesDelays",
    "Sink",
    "Source",
    "TransactionalSource",
    "Transport",
]

#: Source positions to resume from, e.g. {"orders/0": 42} for Kafka topic/partition -> offset.
Checkpoint = Mapping[str, int]


class FencedCheckpoint(dict[str, int]):
    """Positions to store (name -> next position), each only over `expected[name]`: the
    position its batch started from (None: none stored yet). A store that finds another one
    there rolls the whole send back and raises a retriable error: another consumer of the
    partition stored it first (a rebalance moved it while this batch was in hand), so the
    source must receive again from the stored position."""

    def __init__(self, positions: Mapping[str, int], expected: Mapping[str, int | None]) -> None:
        super().__init__(positions)
        self.expected: dict[str, int | None] = dict(expected)


class ReceivedBatch(Protocol):
    messages: Sequence[Envelope]
    poison: Sequence[PoisonMessage]
    expired: int
    checkpoint: Checkpoint | None

    def reject(self, envelope: Envelope, error: BaseException) -> None: ...

    async def commit(self) -> None: ...

    async def abort(self) -> None: ...

    async def __aenter__(self) -> ReceivedBatch: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


@runtime_checkable
class Source(Protocol):
    async def receive_batch(self, max_messages: int, timeout: float) -> ReceivedBatch: ...

    async def close(self) -> None: ...


@runtime_checkable
class Sink(Protocol):
    async def send(
        self, envelopes: Sequence[Envelope], checkpoint: Checkpoint | None = None
    ) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class Readiness(Protocol):
    """A source that says whether its last empty receive meant an empty source."""

    @property
    def ready(self) -> bool: ...


@runtime_checkable
class ReceivesAhead(Protocol):
    """A source that may hold one more batch while one is in hand (asked before each receive)."""

    @property
    def receives_ahead(self) -> bool: ...


@runtime_checkable
class TransactionalSource(Source, Protocol):
    """A source that can write to another address of its own store inside each batch's
    transaction (SQL tables of one database): the route becomes one atomic move."""

    def sink_in_transaction(self, address: str) -> Sink: ...


@runtime_checkable
class CheckpointStore(Protocol):
    """Where a sink keeps source positions next to the rows it wrote (exactly-once)."""

    async def load_checkpoint(self, prefix: str) -> dict[str, int]: ...


@runtime_checkable
class GroupLag(Protocol):
    """A transport whose sources read in consumer groups (Kafka): how far a group is behind.

    `lag` is, summed over the address's partitions, the end offset minus where the group would
    resume: its position in `stored` (a destination's checkpoints, exactly-once) when there is
    one, else its committed offset, else the beginning.
    """

    async def lag(self, address: str, group: str, stored: Checkpoint | None = None) -> int: ...


@runtime_checkable
class PreparesSources(Protocol):
    """A transport that prepares the addresses routes receive from, beyond creating them
    (RabbitMQ: quorum queues get an unlimited delivery limit, as NServiceBus gives them).

    `bridge install` calls it after `install`, with the sources among the addresses; with
    `print_only` it returns what it would do without connecting. Idempotent.
    """

    async def prepare_sources(
        self, addresses: Sequence[str], *, print_only: bool = False
    ) -> list[str]: ...


@runtime_checkable
class ReadsOldestAge(Protocol):
    """A transport whose `peek` leaves out the oldest message's age because reading it costs
    more than a look (RabbitMQ takes the first message and gives it back). `bridge peek` asks
    for it; the service's depth gauge, which peeks every few seconds, never does."""

    async def oldest_age(self, address: str) -> float | None: ...


@runtime_checkable
class SharesDelays(Protocol):
    """A transport whose delayed messages wait in places every destination shares (RabbitMQ's
    delay levels), which `peek` cannot count per destination: `bridge peek` asks for them all
    together; the service's depth gauge never does."""

    async def delayed_all_destinations(self) -> int: ...


@dataclass(frozen=True)
class QueueStats:
    """What `peek` finds at an address: messages waiting, the oldest one's age (None where the
    transport cannot tell or nothing waits), and how many have expired but not been removed."""

    depth: int
    oldest_age_seconds: float | None = None
    expired: int = 0
    #: Messages in the queue for another endpoint, not in `depth`: no source here takes them
    #: (NGinn's store-and-forward rows).
    elsewhere: int = 0
    #: Delayed messages waiting for the address, and seconds until the next is due (negative:
    #: overdue); None where the transport keeps none there or cannot tell.
    delayed: int | None = None
    next_due_seconds: float | None = None
    #: Delayed messages of every destination together, where the transport keeps them in
    #: shared places it cannot look into per destination (RabbitMQ's delay levels); None
    #: elsewhere.
    delayed_all_destinations: int | None = None


@dataclass(frozen=True)
class ServerConnections:
    """What a database server allows in connections, by its own counts."""

    limit: int  # PostgreSQL max_connections, SQL Server @@MAX_CONNECTIONS
    reserved: int = 0  # of those, kept for superusers (and roles given reserved ones)
    others: int | None = None  # held by other clients now; None: the server does not say

    @property
    def available(self) -> int:
        """Connections a client without reserved ones can still open."""
        return self.limit - self.reserved - (self.others or 0)

    def describe(self) -> str:
        parts = [f"{self.limit} allowed"]
        if self.reserved:
            parts.append(f"{self.reserved} reserved for superusers")
        if self.others is not None:
            parts.append(f"{self.others} held by other clients")
        return " - ".join(parts)


@runtime_checkable
class ConnectionLimit(Protocol):
    """A transport whose server limits connections.

    `connections_needed` is the most connections one process could hold for route loops that
    receive there and send elsewhere (`receiving`), send there (`sending`) and move between
    two of its queues (`moving`), its own administration connection included.
    `connections_allowed` asks the server (None: it has no limit to tell).
    """

    def connections_needed(self, receiving: int, sending: int, moving: int) -> int: ...

    async def connections_allowed(self) -> ServerConnections | None: ...


class Transport(Protocol):
    """One per connection in routes.yaml; built by `bridge.transports.load(name, config)`.

    `source`/`sink` open what they need lazily. `install` creates what the addresses need
    (idempotent) or, with `print_only`, returns the exact statements without connecting.
    `check` reaches the connection and returns human-readable warnings (raises on errors).
    `canonical_address` is the address as NServiceBus writes it in headers (wire-format §6).
    """

    name: str

    def source(
        self,
        address: str,
        *,
        group: str | None = None,
        error_queue: str | None = None,
        checkpoint_store: CheckpointStore | None = None,
    ) -> Source: ...

    def sink(self, address: str, *, key: str | None = None) -> Sink: ...

    async def install(self, addresses: Sequence[str], *, print_only: bool = False) -> list[str]: ...

    async def check(self, addresses: Sequence[str]) -> list[str]: ...

    async def peek(self, address: str) -> QueueStats: ...

    def canonical_address(self, address: str) -> str: ...

    async def close(self) -> None: ...
