"""`bridge run`, `bridge migrate` and `bridge report`: the service, the bulk move and the
read-only report."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from bridge.commands.common import (
    known_connection,
    load_routes,
)
from bridge.errors import UsageError


async def run(
    config_path: str,
    *,
    log_level: str,
    log_format: str,
    routes: Sequence[str],
    until_idle: float | None,
    workers: int,
    worker_index: int | None,
    worker_fd: int | None,
) -> int:
    """Run the routes (those named in `routes`, else all) until stopped or idle."""
    from bridge.service.launch import RunOptions
    from bridge.service.launch import run as launch

    config = load_routes(config_path).config
    unknown = [name for name in routes if name not in {r.name for r in config.all_routes}]
    if unknown:
        raise UsageError(f"no route named {unknown[0]!r} in {config_path}")
    options = RunOptions(
        config_path=config_path,
        log_level=log_level,
        log_format=log_format,
        routes=tuple(routes),
        until_idle=until_idle,
        workers=workers,
        worker_index=worker_index,
        worker_fd=worker_fd,
    )
    return await launch(config, options)


async def migrate(config_path: str, route: str, *, master: str, partitions: int | None) -> int:
    """Bulk-move one route's messages with PySpark and print what moved (exit 130 with what
    moved so far on Ctrl-C)."""
    load_routes(config_path)
    from bridge.migrate import require_spark

    require_spark("migrate")
    from bridge.migrate.driver import MigrationFailed, MigrationInterrupted
    from bridge.migrate.driver import migrate as migrate_route
    from bridge.migrate.spec import JobSpec

    spec = JobSpec.from_file(config_path, route)
    try:
        summary = await migrate_route(spec, master=master, partitions=partitions)
    except MigrationFailed as exc:
        if exc.summary is not None:  # how far it got, before the error line
            print(exc.summary.describe(), flush=True)
        raise
    except MigrationInterrupted as exc:
        print(exc.summary.describe(), flush=True)
        print(f"bridge migrate: {exc}", file=sys.stderr)
        return 130
    print(summary.describe())
    return 0


async def report(
    config_path: str,
    connection: str,
    queues: Sequence[str],
    *,
    output: str,
    top: int,
    master: str,
    partitions: int | None,
) -> int:
    """Print what queue tables hold (`output`: table, json or csv), read-only with PySpark;
    on Ctrl-C print nothing but how far it read, and exit 130."""
    config = load_routes(config_path).config
    known_connection(config, connection)
    from bridge.migrate import require_spark

    require_spark("report")
    from bridge.migrate.progress import Interrupted
    from bridge.migrate.render import render
    from bridge.migrate.report import build_report
    from bridge.migrate.spec import ShippedConfig

    try:
        built = await build_report(
            ShippedConfig.read(config_path),
            connection,
            list(queues),
            top=top,
            master=master,
            partitions=partitions,
        )
    except Interrupted as exc:
        print(f"bridge report: {exc}", file=sys.stderr)
        return 130
    print(render(built, output), end="")
    return 0
