"""The names of NGinn event tables: one table per subscription the bridge makes on an NGinn
publisher's behalf, into which only NGinn's Notify writes (`bridge.config.pubsub`); and of
event queues, named the same way: one queue per (Kafka connection, event) on a connection of
SQL queue tables or RabbitMQ where the event is published, subscribed for every Kafka
subscriber of the event there (`room` is then the transport's limit on a queue's name).

NGinn sends an event as it sends a command: the row says nothing of being published
(Impl/MessageBus.cs:347-371 vs 374-398 of lafar6502/nginn-messagebus @1fa4baf). So the bridge
subscribes a table of its own per subscription (subscriber queue, event): every row in it is an
event of that subscription, whatever class NGinn sent (it walks the class chain,
MessageBus.cs:264-287) and whatever correlation id it carries.

Guarantees
    A name is a function of its owner (the subscriber's queue; for Kafka subscribers, who
    share one table per event, their Kafka connection), the event, the room left by the alias,
    and the other names on the connection, never of the order of routes.yaml: `<owner>_<Event
    ShortName>`, the owner and the event's last name part with every character outside
    `[A-Za-z0-9_]` as `_` (NGinn pastes a table name into its SQL unquoted: `INSERT INTO {0}`,
    Impl/SqlQueue/NamedQueries.sqlserver.json:8 and CommonQueueOps.cs:132, so a `.` would read
    as a schema). When that does not fit (`sql://<alias>/<table>` in NGinn's 50-character
    `to_endpoint`, createmqueue.sqlserver.sql), is taken (another queue or table on the
    connection, compared ignoring case as NGinn and SQL Server do), or is the plain name of
    another subscription's table too (two events with one short name: every one of them), the
    owner's name cut to fit, `_`, and 10 hex digits of a SHA-256 of the owner's seed and the
    event; a taken hashed name hashes again with a counter, the colliding ones taken in the
    order of their seeds and events. So adding, removing or moving another subscription in the
    file renames no table, except one whose short name it now shares or no longer shares.

Failures
    `event_tables` gives None when even a bare hash cannot fit (an alias that leaves fewer
    than 11 characters): `bridge check` refuses the subscription.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Collection

__all__ = ["HASH_CHARS", "Wanted", "event_table", "event_table_route", "event_tables"]

#: Hex digits of the hash a name falls back to.
HASH_CHARS = 10
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_]")


def event_table_route(connection: str, table: str) -> str:
    """The name of the route that reads event table `table` on `connection`."""
    return f"events.{connection}.{table}"


def _safe(text: str) -> str:
    name = _NOT_IN_NAME.sub("_", text)
    return name if name[:1].isalpha() or name[:1] == "_" else f"_{name}"


def _hash(queue: str, event: str, attempt: int) -> str:
    seed = f"{queue}\n{event}" + (f"\n{attempt}" if attempt else "")
    return hashlib.sha256(seed.encode()).hexdigest()[:HASH_CHARS]


def _plain(prefix: str, event: str) -> str:
    return f"{prefix}_{_NOT_IN_NAME.sub('_', event.rsplit('.', 1)[-1])}"


def event_table(
    queue: str, event: str, room: int, taken: Collection[str], seed: str | None = None
) -> str | None:
    """The event table of owner `queue` (hashed as `seed`, by default the name) and event
    `event`, wanted alone (`event_tables`): at most `room` characters, not in `taken`
    (casefolded names); None when nothing fits."""
    wanted = (queue, queue if seed is None else seed, event)
    return event_tables([wanted], room, taken)[wanted]


def _hashed(prefix: str, seed: str, event: str, room: int, taken: Collection[str]) -> str:
    stem = prefix[: room - HASH_CHARS - 1]
    attempt = 0
    while True:
        name = f"{stem}_{_hash(seed, event, attempt)}"
        if name.casefold() not in taken:
            return name
        attempt += 1


#: (owner, seed, event): the owner names a table, the seed hashes it.
Wanted = tuple[str, str, str]


def event_tables(
    wanted: Collection[Wanted], room: int, taken: Collection[str]
) -> dict[Wanted, str | None]:
    """The event table of each of `wanted` on one connection, whatever their order: a plain
    name another one wants too goes to every one of them hashed (see Guarantees)."""
    if room < HASH_CHARS + 1:
        return dict.fromkeys(wanted)
    plains = {w: _plain(_safe(w[0]), w[2]) for w in wanted}
    wanting = Counter(name.casefold() for name in plains.values())
    out: dict[Wanted, str | None] = {}
    used = set(taken)
    for w, name in plains.items():
        folded = name.casefold()
        if len(name) <= room and folded not in taken and wanting[folded] == 1:
            out[w] = name
            used.add(folded)
    for w in sorted(set(wanted) - set(out), key=lambda w: (w[1], w[2], w[0])):
        name = _hashed(_safe(w[0]), w[1], w[2], room, used)
        out[w] = name
        used.add(name.casefold())
    return out
