"""The message as it walks the corridor: source -> envelope -> header rules -> sink.

`Headers` is an ordered multimap of `str -> str | None`: order is kept, a name may occur more
than once (Kafka allows it), and `None` (JSON null, Kafka null header) is not the same as `""`.
Dictionary-style reads see the last occurrence, as wire-format §9 asks for the way back to a
dictionary.

`Envelope.expires_at` is absolute wall-clock time (epoch seconds, UTC) computed from what the
source knows of the message's remaining lifetime, so each hop hands on what is left of it. A
message the bridge originates (`bridge send`) also has `time_to_live_ms`, its whole time to
live, which sinks write as given (`bridge.nservicebus.lifetime`): counted down from
`expires_at`, it would arrive a few milliseconds short of what was asked.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

__all__ = [
    "MESSAGE_ID",
    "TIME_SENT",
    "TIME_TO_BE_RECEIVED",
    "Envelope",
    "Headers",
    "PoisonMessage",
]

MESSAGE_ID = "NServiceBus.MessageId"
TIME_SENT = "NServiceBus.TimeSent"
TIME_TO_BE_RECEIVED = "NServiceBus.TimeToBeReceived"


class Headers:
    """Ordered header multimap; the last occurrence of a name wins on lookup."""

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[tuple[str, str | None]] = ()) -> None:
        self._items: list[tuple[str, str | None]] = list(items)

    def __iter__(self) -> Iterator[tuple[str, str | None]]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    @classmethod
    def adopt(cls, items: list[tuple[str, str | None]]) -> Headers:
        """Headers over `items` itself, not a copy: for a codec handing over a list it made."""
        headers = cls.__new__(cls)
        headers._items = items
        return headers

    def __contains__(self, name: object) -> bool:
        for key, _ in self._items:  # noqa: SIM110 (any(genexpr) is 2x slower; runs per message)
            if key == name:
                return True
        return False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Headers) and self._items == other._items

    def __repr__(self) -> str:
        return f"Headers({self._items!r})"

    def items(self) -> list[tuple[str, str | None]]:
        return list(self._items)

    def names(self) -> list[str]:
        return [k for k, _ in self._items]

    def get(self, name: str, default: str | None = None) -> str | None:
        for key, value in reversed(self._items):
            if key == name:
                return value
        return default

    def get_all(self, name: str) -> list[str | None]:
        return [v for k, v in self._items if k == name]

    def add(self, name: str, value: str | None) -> None:
        self._items.append((name, value))

    def set(self, name: str, value: str | None) -> None:
        """Replace every occurrence of `name` with one, at the first occurrence's place."""
        out: list[tuple[str, str | None]] = []
        placed = False
        for key, old in self._items:
            if key != name:
                out.append((key, old))
            elif not placed:
                out.append((key, value))
                placed = True
        if not placed:
            out.append((name, value))
        self._items = out

    def remove(self, name: str) -> None:
        self._items = [(k, v) for k, v in self._items if k != name]

    def rename(self, old: str, new: str) -> None:
        self._items = [(new if k == old else k, v) for k, v in self._items]

    def to_dict(self) -> dict[str, str | None]:
        """Collapse to a dictionary: the last occurrence wins, first position is kept."""
        return dict(self._items)

    def copy(self) -> Headers:
        return Headers(self._items)


@dataclass(slots=True)
class Envelope:
    """One message in transit. `native_id` is the source transport's own id, if any;
    `time_to_live_ms` is set only on a message the bridge originates (module docstring).

    `deliver_at` (epoch seconds, UTC) is an explicit request to deliver no earlier than then,
    which the destination carries out by its native means: it comes only from whoever asked
    the bridge for a delay (`bridge send --delay`, a Kafka record's `NServiceBus.Bridge.DeliverAt`),
    never from `NServiceBus.DeliverAt`, which NServiceBus writes after it has delayed a
    message already and which crosses as information only."""

    headers: Headers
    body: bytes
    expires_at: float | None = None
    native_id: str | None = None
    time_to_live_ms: int | None = None
    deliver_at: float | None = None

    @property
    def message_id(self) -> str | None:
        return self.headers.get(MESSAGE_ID)

    def with_headers(self, headers: Headers) -> Envelope:
        """The same message with other headers: everything else (its lifetime, native id,
        delay request) goes along."""
        return replace(self, headers=headers)

    def ttl_remaining(self, now: float | None = None) -> float | None:
        """Seconds of lifetime left (may be <= 0), or None when the message never expires."""
        if self.expires_at is None:
            return None
        return self.expires_at - (time.time() if now is None else now)

    def is_expired(self, now: float | None = None) -> bool:
        remaining = self.ttl_remaining(now)
        return remaining is not None and remaining <= 0


@dataclass(slots=True)
class PoisonMessage:
    """A message that can never be forwarded as is, kept byte for byte with the reason.

    `raw_headers` is the headers exactly as the source held them (e.g. the SQL Headers column),
    so an error queue copy can carry them unchanged.
    """

    raw_headers: str | bytes | None
    body: bytes
    reason: str
    exception_type: str
    native_id: str | None = None
    headers: Headers = field(default_factory=Headers)
