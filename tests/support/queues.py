"""Reading a queue empty in tests, as a consumer that commits what it takes."""

from __future__ import annotations

from bridge.envelope import Envelope
from bridge.protocols import Transport


async def drain(transport: Transport, queue: str, batch_size: int = 500) -> list[Envelope]:
    """Every message in `queue` (a SQL table or RabbitMQ queue), taken and committed in order,
    until a receive comes back empty."""
    source = transport.source(queue)
    got: list[Envelope] = []
    try:
        while True:
            batch = await source.receive_batch(batch_size, 0.2)
            async with batch:
                got.extend(batch.messages)
                await batch.commit()
            if not batch.messages:
                return got
    finally:
        await source.close()
