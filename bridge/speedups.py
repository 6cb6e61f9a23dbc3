"""The switch behind every speed-up seam: each non-obvious optimisation can be turned off.

A speed-up is a second way of computing what a plain implementation computes (a hand-written
encoder, a vectorised hash, a driver's internals). Each lives behind one named seam that picks
the fast or the plain implementation once, when its module is imported, with `enabled(NAME)`.
`BRIDGE_SPEEDUPS_OFF` (a comma-separated list of names, or `all`) selects the plain ones: for an
A/B benchmark, and as an escape hatch should a driver's internals change under a seam. Each seam
has an equivalence test (fast and plain give the same result) and the bench command that shows
what it buys, in its docstring; `grep -rn "speedups.enabled" bridge` lists them.
"""

from __future__ import annotations

import os

__all__ = ["enabled"]


def enabled(name: str) -> bool:
    """Whether the fast implementation of seam `name` is in use (read from the environment)."""
    off = {part.strip() for part in os.environ.get("BRIDGE_SPEEDUPS_OFF", "").split(",")}
    return not ({"all", name} & off)
