"""Checks of one name: against what its transport accepts, or the NGinn column it goes into."""

from __future__ import annotations

from bridge.config.kinds import RULES
from bridge.errors import ConfigError

__all__ = ["address_name", "nginn_width"]


def nginn_width(value: str, width: int, what: str, where: str) -> None:
    if len(value) > width:
        raise ConfigError(
            f"NGinn {what} {value[:60]!r} is {len(value)} characters; its column holds {width}",
            where,
        )


def address_name(kind: str, name: str, role: str, where: str) -> None:
    """A queue, table or topic name its transport would refuse, found before anything runs.

    Empty names and NUL (every transport's rule) are checked above for every endpoint.
    """
    problem = RULES[kind].address_problem(kind, name)
    if problem is not None:
        raise ConfigError(f"{role}: {problem}", where)
