"""What each speed-up seam buys: a route through `bridge run` with the seam on and off, in turn.

    .venv/bin/python bench/speedups.py amqp_table                   # 3 pairs, 20,000 messages
    .venv/bin/python bench/speedups.py tuning --pairs 5 --messages 50000
    .venv/bin/python bench/speedups.py all                          # every seam, one after another

Each seam (`bridge/speedups.py`; `tuning` is `bridge/service/tuning.py`) is measured on the route
where it does its work, with `bench/routes.py --no-legs --no-baseline --latency-seconds 0`
(throughput only, one worker), run A B A B ...: A with the seam as shipped, B with it switched
off through the environment of the bridge it starts (`BRIDGE_SPEEDUPS_OFF=NAME`, or
`BRIDGE_TUNING=off`). It prints, per route, each pair's msgs/s and the bridge's CPU time per
message, and the median of the pairs' ratios on / off: a seam earns its place when its CPU ratio
stays below 1 by more than the spread of the pairs.
"""

from __future__ import annotations

if __package__ in (None, ""):  # `python bench/speedups.py`: import bench as a package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "bench"

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

#: seam -> (the routes.py --routes and --db it is measured on, the environment that turns it off)
SEAMS: dict[str, tuple[str, str, dict[str, str]]] = {
    "amqp_table": ("sql-rabbitmq", "postgresql", {"BRIDGE_SPEEDUPS_OFF": "amqp_table"}),
    "pika_coalesce_writes": (
        "sql-rabbitmq",
        "postgresql",
        {"BRIDGE_SPEEDUPS_OFF": "pika_coalesce_writes"},
    ),
    "kafka_partitioner": ("sql-kafka", "postgresql", {"BRIDGE_SPEEDUPS_OFF": "kafka_partitioner"}),
    "kafka_record_batches": (
        "sql-kafka",
        "postgresql",
        {"BRIDGE_SPEEDUPS_OFF": "kafka_record_batches"},
    ),
    "sql_headers_orjson": (
        "sql-kafka,kafka-sql",
        "postgresql",
        {"BRIDGE_SPEEDUPS_OFF": "sql_headers_orjson"},
    ),
    "tuning": ("sql-kafka", "postgresql", {"BRIDGE_TUNING": "off"}),
}

ROUTES = Path(__file__).resolve().parent / "routes.py"


def one_run(
    routes: str, db: str, messages: int, env: dict[str, str]
) -> dict[str, dict[str, float]]:
    """route -> {rate, cpu_us} of one routes.py run."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        command = [
            sys.executable,
            str(ROUTES),
            f"--messages={messages}",
            f"--routes={routes}",
            f"--db={db}",
            "--workers=1",
            "--no-legs",
            "--no-baseline",
            "--latency-seconds=0",
            f"--json={out}",
        ]
        done = subprocess.run(
            command, env={**os.environ, **env}, capture_output=True, text=True, check=False
        )
        if done.returncode != 0 or not out.exists():
            raise SystemExit(f"routes.py failed ({done.returncode}):\n{done.stderr[-2000:]}")
        results = json.loads(out.read_text())["results"]
    return {f"{r['route']} {r['db']}": {"rate": r["rate"], "cpu_us": r["cpu_us"]} for r in results}


def measure(seam: str, pairs: int, messages: int, db: str | None = None) -> None:
    routes, default_db, off = SEAMS[seam]
    db = db or default_db
    shown = " ".join(f"{k}={v}" for k, v in off.items())
    print(f"\n{seam}: {routes} on {db}, {messages:,} messages, {pairs} pairs (off: {shown})")
    runs: list[tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]] = []
    for i in range(pairs):
        on = one_run(routes, db, messages, {})
        plain = one_run(routes, db, messages, off)
        runs.append((on, plain))
        print(f"  pair {i + 1} done", flush=True)
    print()
    print("| route | pair | msgs/s on | msgs/s off | CPU µs/msg on | CPU µs/msg off |")
    print("|---|---|---|---|---|---|")
    for route in runs[0][0]:
        rate_ratios, cpu_ratios = [], []
        for i, (on, plain) in enumerate(runs, 1):
            a, b = on[route], plain[route]
            rate_ratios.append(a["rate"] / b["rate"])
            cpu_ratios.append(a["cpu_us"] / b["cpu_us"])
            print(
                f"| {route} | {i} | {a['rate']:,.0f} | {b['rate']:,.0f} | "
                f"{a['cpu_us']:.1f} | {b['cpu_us']:.1f} |"
            )
        print(
            f"| {route} | on / off, median (min-max) | "
            f"{statistics.median(rate_ratios):.3f} ({min(rate_ratios):.3f}-{max(rate_ratios):.3f})"
            f" | | {statistics.median(cpu_ratios):.3f} "
            f"({min(cpu_ratios):.3f}-{max(cpu_ratios):.3f}) | |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("seam", choices=[*SEAMS, "all"])
    parser.add_argument("--pairs", type=int, default=3, help="A/B pairs (default 3)")
    parser.add_argument("--messages", type=int, default=20_000, help="per route and run")
    parser.add_argument("--db", choices=("postgresql", "sqlite"), help="instead of the seam's")
    args = parser.parse_args()
    for seam in SEAMS if args.seam == "all" else [args.seam]:
        measure(seam, args.pairs, args.messages, args.db)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
