"""`Batch`: settle once; a commit that failed is settled, and nothing settles it again."""

from __future__ import annotations

import pytest

from bridge.batch import Batch
from bridge.errors import SettleError, TransportUnavailable


async def test_a_commit_whose_transport_failed_is_failed_not_committed_and_never_aborted() -> None:
    calls: list[str] = []

    async def commit() -> None:
        calls.append("commit")
        raise TransportUnavailable("the error queue refused the copies")

    async def abort() -> None:
        calls.append("abort")

    batch = Batch(on_commit=commit, on_abort=abort)
    with pytest.raises(TransportUnavailable):
        async with batch:
            await batch.commit()
    assert batch.settled == "failed"
    with pytest.raises(SettleError, match="already failed"):
        await batch.abort()
    with pytest.raises(SettleError, match="already failed"):
        await batch.commit()
    assert calls == ["commit"]  # the transport returned the messages itself, once


async def test_leaving_the_block_unsettled_aborts_once() -> None:
    calls: list[str] = []

    async def abort() -> None:
        calls.append("abort")

    batch = Batch(on_abort=abort)
    async with batch:
        pass
    assert batch.settled == "aborted"
    with pytest.raises(SettleError):
        await batch.commit()
    assert calls == ["abort"]
