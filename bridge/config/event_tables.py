"""The names of NGinn event tables: one table per subscription the bridge makes on an NGinn
publisher's behalf, into which only NGinn's Notify writes (`bridge.config.pubsub`).

NGinn sends an event as it sends a command: the row says nothing of being published
(Impl/MessageBus.cs:347-371 vs 374-398 of lafar6502/nginn-messagebus @1fa4baf). So the bridge
subscribes a table of its own per subscription (subscriber queue, event): every row in it is an
event of that subscription, whatever class NGinn sent (it walks the class chain,
MessageBus.cs:264-287) and whatever correlation id it carries.

Guarantees
    A name is a function of the subscriber's queue, the event and the room left by the alias:
    `<queue>_<EventShortName>`, the queue and the event's last name part with every character
    outside `[A-Za-z0-9_]` as `_` (NGinn pastes a table name into its SQL unquoted: `INSERT
    INTO {0}`, Impl/SqlQueue/NamedQueries.sqlserver.json:8 and CommonQueueOps.cs:132, so a `.`
    would read as a schema). When that does not fit (`sql://<alias>/<table>` in NGinn's
    50-character `to_endpoint`, createmqueue.sqlserver.sql) or is taken (another queue or
    event table on the connection, compared ignoring case as NGinn and SQL Server do), the
    queue's name cut to fit, `_`, and 10 hex digits of a SHA-256 of queue and event; a taken
    hashed name hashes again with a counter.

Failures
    `event_table` returns None when even a bare hash cannot fit (an alias that leaves fewer
    than 11 characters): `bridge check` refuses the subscription.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection

__all__ = ["HASH_CHARS", "event_table", "event_table_route"]

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


def event_table(queue: str, event: str, room: int, taken: Collection[str]) -> str | None:
    """The event table of subscriber queue `queue` and event `event`: at most `room`
    characters, not in `taken` (casefolded names); None when nothing fits."""
    if room < HASH_CHARS + 1:
        return None
    prefix = _safe(queue)
    plain = f"{prefix}_{_NOT_IN_NAME.sub('_', event.rsplit('.', 1)[-1])}"
    if len(plain) <= room and plain.casefold() not in taken:
        return plain
    stem = prefix[: room - HASH_CHARS - 1]
    attempt = 0
    while True:
        name = f"{stem}_{_hash(queue, event, attempt)}"
        if name.casefold() not in taken:
            return name
        attempt += 1
