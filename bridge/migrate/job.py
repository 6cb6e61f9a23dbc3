"""The `spark-submit` entry point of `bridge migrate`:

    spark-submit bridge/migrate/job.py --route NAME -c routes.yaml [--partitions N]

(also `python -m bridge.migrate.job --master local[4] ...`). The master and every Spark setting
come from spark-submit unless `--master` is given. The executors need `bridge` installed with
the drivers its connections use (e.g. `pip install './[postgresql,kafka]'` from the checkout,
in their image), and every connection reachable from them; routes.yaml is read here and shipped
to the tasks with the environment variables it references. Output and exit codes are those of
`bridge migrate`: 0 done, 1 a task failed for good (or Spark could not run), 2 a config error,
130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    from bridge.errors import BridgeError, ConfigError
    from bridge.migrate.driver import MigrationFailed, MigrationInterrupted, migrate
    from bridge.migrate.spec import JobSpec
    from bridge.telemetry.logs import setup_logging
    from bridge.telemetry.redact import redactor

    parser = argparse.ArgumentParser(
        prog="bridge-migrate", description="Move a route's backlog with Spark."
    )
    parser.add_argument("--route", required=True, help="the route whose backlog to move")
    parser.add_argument("-c", "--config", default="routes.yaml", help="routes file")
    parser.add_argument("--master", help="Spark master URL (default: spark-submit's)")
    parser.add_argument("--partitions", type=int, help="SQL ranges (default 4 x parallelism)")
    parser.add_argument("--log-level", default=os.environ.get("BRIDGE_LOG_LEVEL", "INFO"))
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    try:
        spec = JobSpec.from_file(args.config, args.route)
        spec.shipped.remember_secrets()
        summary = asyncio.run(migrate(spec, master=args.master, partitions=args.partitions))
    except ConfigError as exc:
        print(redactor(str(exc)), file=sys.stderr)
        return 2
    except MigrationFailed as exc:
        if exc.summary is not None:
            print(exc.summary.describe(), flush=True)
        print(f"bridge migrate: {redactor(str(exc))}", file=sys.stderr)
        return 1
    except MigrationInterrupted as exc:
        print(exc.summary.describe(), flush=True)
        print(f"bridge migrate: {exc}", file=sys.stderr)
        return 130
    except BridgeError as exc:
        print(f"bridge migrate: {redactor(str(exc))}", file=sys.stderr)
        return 1
    print(summary.describe())
    return 0


def _without_script_folder() -> None:
    """spark-submit runs this file as a script, which puts its folder first on sys.path; the
    modules next to it must only ever be imported as `bridge.migrate.*`."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]


if __name__ == "__main__":
    _without_script_folder()
    raise SystemExit(main())
