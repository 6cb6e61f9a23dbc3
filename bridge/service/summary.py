"""What `bridge run --until-idle` prints on stdout when it ends: one line per route, then a total.

    route sales-to-kafka: 1000 forwarded, 2 expired, 0 to the error queue in 1.4 s
    total: 1000 forwarded, 2 expired, 0 to the error queue; ran 2.5 s

A route's time runs from its start to the end of its last batch (the drain); the total's is
the whole run, the wait for idle included. With `--workers N` each worker hands its own
summary to the primary (`WorkerLink.report`), which adds the counts up, keeps each route's
longest time, and prints one summary for the whole run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["RouteSummary", "RunSummary"]


@dataclass
class RouteSummary:
    name: str
    forwarded: int = 0
    expired: int = 0
    poison: int = 0
    seconds: float = 0.0
    failed: bool = False

    def counts(self) -> str:
        return (
            f"{self.forwarded} forwarded, {self.expired} expired, {self.poison} to the error queue"
        )


@dataclass
class RunSummary:
    routes: list[RouteSummary]
    seconds: float = 0.0
    #: What could not be counted (a worker that ended without handing in its summary).
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"routes": [asdict(r) for r in self.routes], "seconds": self.seconds}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunSummary:
        return cls([RouteSummary(**r) for r in data["routes"]], float(data["seconds"]))

    @classmethod
    def merge(cls, parts: Iterable[RunSummary], names: Sequence[str], seconds: float) -> RunSummary:
        """The workers' summaries as one: counts added, each route's longest time."""
        routes = {name: RouteSummary(name) for name in names}
        for part in parts:
            for route in part.routes:
                into = routes.setdefault(route.name, RouteSummary(route.name))
                into.forwarded += route.forwarded
                into.expired += route.expired
                into.poison += route.poison
                into.seconds = max(into.seconds, route.seconds)
                into.failed = into.failed or route.failed
        return cls(list(routes.values()), seconds)

    def describe(self) -> str:
        lines = [
            f"route {r.name}: {r.counts()} in {r.seconds:.1f} s" + (" (failed)" if r.failed else "")
            for r in self.routes
        ]
        total = RouteSummary(
            "total",
            sum(r.forwarded for r in self.routes),
            sum(r.expired for r in self.routes),
            sum(r.poison for r in self.routes),
        )
        lines.append(f"total: {total.counts()}; ran {self.seconds:.1f} s")
        lines += [f"warning: {note}" for note in self.notes]
        return "\n".join(lines)
