"""What `routes.py` prints and saves: the tables, the ratios they derive, medians of saved runs."""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "RouteResult",
    "ceiling",
    "combine",
    "leg_cost",
    "percentile",
    "print_table",
    "report",
]

CORES = os.cpu_count() or 1


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def _fmt(value: object) -> str:
    if isinstance(value, float):
        if value != value:  # nan
            return "-"
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"
    return str(value)


def print_table(head: Sequence[str], rows: Sequence[Sequence[object]], file: object = None) -> str:
    """A Markdown table (aligned), printed and returned."""
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(head)]

    def line(values: Sequence[str]) -> str:
        return "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)) + " |"

    text = "\n".join(
        [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, cells)]
    )
    print(text, file=file or sys.stdout, flush=True)
    return text


@dataclass
class RouteResult:
    route: str
    db: str
    workers: int = 1
    rate: float = float("nan")
    cpu_us: float = float("nan")
    machine_busy: float = float("nan")
    stolen: float = float("nan")  # share of the machine's CPU the hypervisor took, throughput
    latency_stolen: float = float("nan")  # and in the latency phase
    #: the local Kafka broker's CPU (share of one core) in the latency phase's first and last
    #: full second, for a route with a Kafka end: its fetches cost more as record batches pile up
    broker_cpu_first: float = float("nan")
    broker_cpu_last: float = float("nan")
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    #: messages a batch the bridge forwarded in the latency phase (its `bridge_batch_size`)
    latency_batch: float = float("nan")
    offered: float = float("nan")
    raw_leg: str = ""
    raw_rate: float = float("nan")
    baseline: float = float("nan")
    ceiling: float = float("nan")  # msgs/s the machine could do with both raw legs' CPU work
    duplicates: int = 0
    missing: int = 0
    notes: list[str] = field(default_factory=list)


def leg_cost(legs: dict[str, float], busy: dict[str, float], name: str) -> float:
    """Machine CPU seconds (all cores) that one message of a raw leg took."""
    return busy.get(name, float("nan")) * CORES / legs.get(name, float("nan"))


def ceiling(legs: dict[str, float], busy: dict[str, float], names: tuple[str, str]) -> float:
    """The most msgs/s this machine could give a route that does both raw legs' work (their
    client work and their database or broker work) with every core busy: the machine has CORES
    CPU seconds a second, one message of the route takes at least both legs' CPU seconds."""
    return CORES / sum(leg_cost(legs, busy, name) for name in names)


# -- output --------------------------------------------------------------------------------------

HEAD = (
    "route",
    "database",
    "workers",
    "msgs/s",
    "bridge CPU µs/msg",
    "machine CPU busy",
    "CPU stolen (run / latency)",
    "p50 ms",
    "p99 ms",
    "msgs a batch (latency)",
    "tansu CPU (latency, 1st / last s)",
    "slower raw leg",
    "leg msgs/s",
    "route / leg",
    "legs' CPU ceiling",
    "route / ceiling",
    "baseline msgs/s",
    "route / baseline",
)


def rows_of(results: list[RouteResult]) -> list[list[object]]:
    return [
        [
            r.route,
            r.db,
            r.workers,
            r.rate,
            r.cpu_us,
            f"{r.machine_busy:.0%}",
            f"{r.stolen:.0%} / {r.latency_stolen:.0%}",
            r.p50_ms,
            r.p99_ms,
            r.latency_batch,
            _broker_cpu(r),
            r.raw_leg,
            r.raw_rate,
            r.rate / r.raw_rate,
            r.ceiling,
            r.rate / r.ceiling,
            r.baseline,
            r.rate / r.baseline,
        ]
        for r in results
    ]


def _broker_cpu(r: RouteResult) -> str:
    if math.isnan(r.broker_cpu_first):
        return "-"
    return f"{r.broker_cpu_first:.0%} / {r.broker_cpu_last:.0%}"


def report(
    legs: dict[str, float],
    busy: dict[str, float],
    stolen: dict[str, float],
    results: list[RouteResult],
    runs: int,
) -> None:
    suffix = f" (median of {runs} runs)" if runs > 1 else ""
    print(f"\nraw legs{suffix}\n")
    print_table(
        ("leg", "msgs/s", "machine CPU busy", "CPU stolen", "machine CPU µs/msg"),
        [
            [
                name,
                rate,
                f"{busy.get(name, float('nan')):.0%}",
                f"{stolen.get(name, float('nan')):.0%}",
                leg_cost(legs, busy, name) * 1e6,
            ]
            for name, rate in sorted(legs.items())
        ],
    )
    print(f"\nroutes{suffix}\n")
    print_table(HEAD, rows_of(results))
    for r in results:
        if r.duplicates or r.missing or r.notes:
            print(
                f"{r.route} {r.db} workers {r.workers}: "
                f"duplicates {r.duplicates}, missing {r.missing}; " + "; ".join(r.notes)
            )


def combine(paths: list[str]) -> None:
    """Medians, cell by cell, of runs saved with --json."""
    runs = [json.loads(Path(p).read_text()) for p in paths]

    def per_leg(key: str) -> dict[str, float]:
        """Median of each leg's `key` cell over the runs that have it."""
        names = dict.fromkeys(name for run in runs for name in run.get(key, {}))
        return {
            name: statistics.median(run[key][name] for run in runs if name in run.get(key, {}))
            for name in names
        }

    legs, busy, stolen = per_leg("legs"), per_leg("leg_busy"), per_leg("leg_stolen")
    results = []
    for first in runs[0]["results"]:
        same = [
            r
            for run in runs
            for r in run["results"]
            if (r["route"], r["db"], r.get("workers", 1))
            == (first["route"], first["db"], first.get("workers", 1))
        ]
        merged = RouteResult(
            first["route"], first["db"], first.get("workers", 1), raw_leg=first["raw_leg"]
        )
        for key in (
            "rate",
            "cpu_us",
            "machine_busy",
            "stolen",
            "latency_stolen",
            "broker_cpu_first",
            "broker_cpu_last",
            "p50_ms",
            "p99_ms",
            "latency_batch",
            "offered",
            "raw_rate",
            "baseline",
            "ceiling",
        ):
            values = [r[key] for r in same if key in r and not math.isnan(r[key])]
            setattr(merged, key, statistics.median(values) if values else float("nan"))
        merged.raw_rate = legs.get(merged.raw_leg, float("nan"))
        merged.duplicates = sum(r["duplicates"] for r in same)
        merged.missing = sum(r["missing"] for r in same)
        merged.notes = [n for r in same for n in r["notes"]]
        results.append(merged)
    print("machine:", json.dumps(runs[0]["machine"], indent=1))
    report(legs, busy, stolen, results, len(runs))
