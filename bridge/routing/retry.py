"""Capped exponential backoff with equal jitter (AWS architecture blog's "equal jitter")."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["Backoff"]


@dataclass
class Backoff:
    """The delays of one loop's failures in a row.

    The n-th delay (from 0) is drawn uniformly from [ceiling / 2, ceiling], where ceiling is
    `initial * multiplier**n` capped at `maximum`: half of the wait is certain, so a service
    that is down is not hammered, and half is random, so loops that failed together do not
    retry in step. The ceiling is carried from one delay to the next and capped at each step,
    never raised to a power, so a route that retries for days cannot overflow.
    """

    initial: float = 0.1
    maximum: float = 30.0
    multiplier: float = 2.0
    attempts: int = field(default=0, init=False)
    _ceiling: float = field(default=0.0, init=False, repr=False)

    def next_delay(self) -> float:
        """Seconds to wait before the next attempt (equal jitter); grows until `maximum`."""
        grown = self.initial if self.attempts == 0 else self._ceiling * self.multiplier
        self._ceiling = min(self.maximum, grown)
        self.attempts += 1
        return random.uniform(self._ceiling / 2, self._ceiling)  # noqa: S311 - jitter, not crypto

    def reset(self) -> None:
        self.attempts = 0
