"""Capped exponential backoff with full jitter (AWS architecture blog's "full jitter")."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["Backoff"]


@dataclass
class Backoff:
    initial: float = 0.1
    maximum: float = 30.0
    multiplier: float = 2.0
    attempts: int = field(default=0, init=False)

    def next_delay(self) -> float:
        """Seconds to wait before the next attempt; grows until `maximum`."""
        ceiling = min(self.maximum, self.initial * self.multiplier**self.attempts)
        self.attempts += 1
        return random.uniform(ceiling / 2, ceiling)  # noqa: S311 - jitter, not crypto

    def reset(self) -> None:
        self.attempts = 0
