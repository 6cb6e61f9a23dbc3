"""Whether the routes of a config could need more server connections than a server allows.

`bridge run` runs every route of the config in one process (or in each of `--workers N`), and a
route's loops lease database connections from their connection's pool: at most `pool_size` at
once, plus the transport's administration connection (`bridge.transports.sql.pool`). Fewer
when the routes' loops could not hold that many: a loop receiving ahead holds two, one moving
between two tables of one database one, a sink one. `bridge check --connect` compares that with
what the server has left (PostgreSQL: `max_connections` less the reserved ones and those other
clients hold; SQL Server: `@@MAX_CONNECTIONS`) and warns when it is more, for one process: each
worker of `bridge run --workers N` holds as many.
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge.config.models import BridgeConfig
from bridge.protocols import ConnectionLimit, Transport

__all__ = ["Loops", "connection_warnings", "loops_on"]


@dataclass
class Loops:
    """Route loops with an end on one connection, by what they do there."""

    receiving: int = 0  # receive here, send elsewhere
    sending: int = 0  # send here, receive elsewhere
    moving: int = 0  # both ends here

    @property
    def total(self) -> int:
        return self.receiving + self.sending + self.moving


def loops_on(config: BridgeConfig, connection: str) -> Loops:
    """Every route's loops (`concurrency` each) with an end on `connection`."""
    counted = Loops()
    for route in config.all_routes:
        source, destination = route.from_.connection, route.to.connection
        if source == destination == connection:
            counted.moving += route.concurrency
        elif source == connection:
            counted.receiving += route.concurrency
        elif destination == connection:
            counted.sending += route.concurrency
    return counted


async def connection_warnings(
    config: BridgeConfig, connection: str, transport: Transport
) -> list[str]:
    """A warning when one process's routes could need more connections than the server has
    left; none when they fit, or the transport has no server limit."""
    if not isinstance(transport, ConnectionLimit):
        return []
    allowed = await transport.connections_allowed()
    if allowed is None:
        return []
    counted = loops_on(config, connection)
    needed = transport.connections_needed(counted.receiving, counted.sending, counted.moving)
    if needed <= allowed.available:
        return []
    pool = getattr(config.connections[connection], "pool_size", None)
    capped = f", pool_size {pool}" if pool is not None else ""
    return [
        f"the routes could hold {needed} server connections at once in one `bridge run` "
        f"process ({counted.total} route loops{capped}, and 1 for administration), but the "
        f"server has {max(allowed.available, 0)} left ({allowed.describe()}): routes would "
        "fail to connect; lower pool_size or raise the server's limit (each worker of "
        "`bridge run --workers N` holds as many)"
    ]
