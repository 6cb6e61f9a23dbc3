"""A route's state, derived from its loops' states, and what a loop's failure records and logs.

State
    Each loop has its own state and the route's is derived from them: `failing` when any loop
    is failing (below), else `backoff` when any loop is in backoff, `running` only when every
    loop is, else `starting`. A loop is running once
    its `probe` (reaching the source and the destination) has passed and a receive returned:
    a sink that connects at its first send, behind an empty source, cannot make an unreachable
    destination look ready. The probe runs when the loop starts and again after each backoff,
    not per batch. `failed` and `stopped` are set on the route alone; once either is, the
    loops' states no longer change the route's.

Failures
    A retriable error (`retriable = True` on the `BridgeError` class) puts the loop into backoff
    (capped exponential, jittered: 0.1 s doubling to `RETRY_MAX`, 20 s) and it retries on its
    own, so a route runs again within about 20 s of its service's return. Any other
    error (a refused login, `AccessRefused`; a missing table or queue; an untranslated driver
    error) will not go away by retrying, but someone may fix it while the service runs (a
    password changed back, a grant, `bridge install`): the loop is `failing`, logs the error at
    ERROR saying so, and tries again slowly (1 s doubling to `PERMANENT_RETRY_MAX`, 5 minutes),
    so a refused login is not repeated often enough to lock an account or flood the server's
    log. With `stop_on_fatal` (the `--until-idle` mode) such an error stops the route instead,
    so a drain does not spin forever (`bridge.routing.runner`).

Logs
    State changes (INFO) and each failure with its retry (WARNING, or ERROR for one that will
    not go away); never a line per message. They carry `route` and `state` as structured fields.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from bridge.routing.retry import Backoff
from bridge.telemetry.metrics import RouteMetrics

__all__ = ["PERMANENT_RETRY_MAX", "RETRY_MAX", "RouteState", "RouteStats"]

log = logging.getLogger("bridge.route")

#: The longest wait between two attempts of a loop whose error may go away (a service down, a
#: network gone): the most a route can lag behind its service's return, within the fault
#: suite's 30 s (tests/integration/test_network_faults.py).
RETRY_MAX = 20.0
#: The longest wait between two attempts of a loop whose error will not go away by retrying.
PERMANENT_RETRY_MAX = 300.0


@dataclass
class RouteStats:
    forwarded: int = 0
    expired: int = 0
    poison: int = 0
    retried: int = 0
    retried_messages: int = 0
    batches: int = 0
    #: Subscribe/Unsubscribe control messages a proxy's route dropped (`nservicebus/events.py`).
    control_dropped: int = 0
    #: Published events forwarded, by event type (the most derived one they carry).
    published: dict[str, int] = field(default_factory=dict)
    state: str = "starting"
    last_error: str | None = None
    last_error_at: float | None = None
    last_activity: float = field(default_factory=time.monotonic)


class RouteState:
    """The states of one route's loops and the route's own, kept in `stats.state`."""

    def __init__(
        self, name: str, concurrency: int, stats: RouteStats, metrics: RouteMetrics
    ) -> None:
        self._name = name
        self._stats = stats
        self._metrics = metrics
        #: Each loop's state, by its index.
        self.loops = ["starting"] * concurrency

    def set(self, state: str) -> None:
        """The route's state (logged when it changes)."""
        old = self._stats.state
        if old != state:
            log.info(
                "route %s: %s -> %s",
                self._name,
                old,
                state,
                extra={"route": self._name, "state": state, "previous_state": old},
            )
            self._stats.state = state

    def set_loop(self, index: int, state: str) -> None:
        """One loop's state; the route's follows from all of them (see the module docstring)."""
        self.loops[index] = state
        if self._stats.state in ("failed", "stopped"):
            return
        if "failing" in self.loops:
            self.set("failing")
        elif "backoff" in self.loops:
            self.set("backoff")
        elif all(s == "running" for s in self.loops):
            self.set("running")
        else:
            self.set("starting")

    def failed(
        self, index: int, exc: Exception, backoff: Backoff, aborted: int, *, permanent: bool
    ) -> float:
        """Record and log a loop's failure; the seconds it waits before it tries again.

        `aborted` messages went back to the source. `permanent`: the error will not go away by
        retrying (see the module docstring).
        """
        stats = self._stats
        stats.retried += 1
        stats.retried_messages += aborted
        self._metrics.retried(aborted)
        stats.last_error = f"{type(exc).__name__}: {exc}"
        stats.last_error_at = time.time()
        delay = backoff.next_delay()
        self.set_loop(index, "failing" if permanent else "backoff")
        extra = {"route": self._name, "state": stats.state}
        if permanent:
            log.error(
                "route %s: %s; this will not go away on its own: fix it (the credentials, the "
                "permissions, or what is missing) and the route resumes; trying again in %.0fs",
                self._name,
                stats.last_error,
                delay,
                extra=extra,
            )
        else:
            log.warning(
                "route %s: %s; retrying in %.2fs",
                self._name,
                stats.last_error,
                delay,
                extra=extra,
            )
        return delay
