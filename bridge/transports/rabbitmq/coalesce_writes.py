"""Frames of one publish joined into few socket writes: the seam `pika_coalesce_writes`.

Why: pika sends each buffered frame with a send() of its own once the socket is writable:
three per message (method, header, body), each a TCP segment for the kernel and the broker;
the same bytes in fewer buffers go out in fewer sends. Bench: `bench/speedups.py
pika_coalesce_writes`. Plain: nothing is joined, pika writes as it does. Equivalence:
`tests/integration/test_rabbitmq_coalesce_writes.py` (a batch published either way arrives
complete, in order, byte for byte).

This reaches into pika's transport (`_transport._tx_buffers`, pika 1.x); should that change,
the fast path does nothing and every frame goes out as with the plain one.
"""

from __future__ import annotations

import collections

from pika.adapters.select_connection import SelectConnection

from bridge import speedups

__all__ = ["WRITE_CHUNK", "coalesce_writes", "coalesced", "uncoalesced"]

#: The largest write; the cap keeps the copy pika makes of a partly sent buffer's rest small.
WRITE_CHUNK = 128 * 1024


def coalesced(connection: SelectConnection | None) -> None:
    """Join the frames pika buffered for the socket into writes of up to `WRITE_CHUNK` bytes."""
    buffers = getattr(getattr(connection, "_transport", None), "_tx_buffers", None)
    if not isinstance(buffers, collections.deque) or len(buffers) < 2:
        return
    chunks: list[bytes] = []
    run: list[bytes] = []
    size = 0
    for buffer in buffers:
        if run and size + len(buffer) > WRITE_CHUNK:
            chunks.append(b"".join(run))
            run, size = [], 0
        run.append(buffer)
        size += len(buffer)
    chunks.append(b"".join(run))
    buffers.clear()
    buffers.extend(chunks)


def uncoalesced(connection: SelectConnection | None) -> None:
    """Leave pika's buffers as they are: one send() per frame."""


coalesce_writes = coalesced if speedups.enabled("pika_coalesce_writes") else uncoalesced
