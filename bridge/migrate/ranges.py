"""Splitting an inclusive range of sequence numbers into contiguous parts for parallel tasks."""

from __future__ import annotations

__all__ = ["split"]


def split(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    """At most `parts` contiguous inclusive ranges of near-equal width covering lo..hi.

    Widths are by sequence number, not by rows: gaps left by received rows make some ranges
    lighter than others, which is why the driver asks for more ranges than cores.
    """
    if parts < 1:
        raise ValueError("parts must be at least 1")
    if hi < lo:
        return []
    width = hi - lo + 1
    parts = min(parts, width)
    step, extra = divmod(width, parts)
    ranges = []
    start = lo
    for index in range(parts):
        end = start + step - 1 + (1 if index < extra else 0)
        ranges.append((start, end))
        start = end + 1
    return ranges
