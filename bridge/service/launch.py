"""How `bridge run` starts: this process runs the routes, or it is one worker of a primary,
or it is the primary of `--workers N` (see `bridge.service.workers`).

A worker is started as `bridge run` with the primary's own options, plus the hidden
`--worker-index` and `--worker-fd`; it serves its status on a port of its own on 127.0.0.1
and the primary serves the configured one. A configured address it cannot listen on ends the
run with the `http` block's `FILE:LINE:COL` and the address (`CannotListen`).

With `--until-idle`, the run ends by printing what each route did on stdout
(`bridge.service.summary`): this process's own, or, as a primary, its workers' added up (a
worker hands its summary to the primary and prints none).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from bridge.config.loader import load_config
from bridge.config.models import BridgeConfig, HttpConfig
from bridge.errors import BridgeError
from bridge.service.http import CannotListen
from bridge.service.supervisor import Supervisor
from bridge.service.tuning import tune_process
from bridge.service.workers import WorkerLink, Workers
from bridge.telemetry.tracing import setup_tracing

__all__ = ["RunOptions", "run"]

log = logging.getLogger("bridge")


@dataclass(frozen=True)
class RunOptions:
    """What `bridge run` was asked for; a primary hands the same to each worker."""

    config_path: str
    log_level: str
    log_format: str
    routes: Sequence[str] = ()
    until_idle: float | None = None
    workers: int = 1
    worker_index: int | None = None
    worker_fd: int | None = None

    def worker_args(self) -> list[str]:
        """A worker's `bridge run` options: this command's own, without `--workers`."""
        args = ["-c", self.config_path, "--log-level", self.log_level]
        args += ["--log-format", self.log_format]
        for name in self.routes:
            args += ["--route", name]
        if self.until_idle is not None:
            args += ["--until-idle", str(self.until_idle)]
        return args


async def run(config: BridgeConfig, options: RunOptions) -> int:
    """Run the routes of `config` (those named in `options.routes`, else all); the exit code."""
    try:
        return await _run(config, options)
    except CannotListen as exc:
        exc.location = _http_location(options.config_path, exc.key)
        raise


def _http_location(config_path: str, key: str) -> str | None:
    """`FILE:LINE:COL` of `http.<key>` (of the `http` block when the key is not written), read
    from the config file again: the supervisor gets the config without its positions. None
    when the file cannot be read any more."""
    try:
        positions = load_config(config_path, offline=True).positions
    except (BridgeError, OSError):
        return None
    return positions.at(("http", key))


async def _run(config: BridgeConfig, options: RunOptions) -> int:
    if options.workers > 1 and options.worker_index is None:
        return await _primary(config, options)
    link = None
    if options.worker_fd is not None:
        link = WorkerLink(options.worker_fd)
        if config.http is not None:  # the primary serves the port; this worker, one of its own
            config = config.model_copy(update={"http": HttpConfig(host="127.0.0.1", port=0)})
    if setup_tracing():
        log.info("exporting traces over OTLP")
    supervisor = Supervisor(
        config, routes=options.routes or None, until_idle=options.until_idle, link=link
    )
    tune_process()
    code = await supervisor.run()
    if options.until_idle is not None and link is None:
        print(supervisor.summary().describe(), flush=True)
    return code


async def _primary(config: BridgeConfig, options: RunOptions) -> int:
    """Start `options.workers` workers and keep them up."""
    names = [r.name for r in config.all_routes if not options.routes or r.name in options.routes]
    http = None if config.http is None else (config.http.host, config.http.port)
    workers = Workers(
        options.workers,
        options.worker_args(),
        routes=names,
        http=http,
        until_idle=options.until_idle is not None,
    )
    code = await workers.run()
    if options.until_idle is not None:
        print(workers.summary().describe(), flush=True)
    return code
