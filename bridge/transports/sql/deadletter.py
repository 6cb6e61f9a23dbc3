"""A source's error-queue copies, inserted in the receive's own transaction.

A batch's poison messages (Headers no codec can read) and the messages the runner rejected
(`Batch.reject`) are copied into the source's `error_queue` table right before the batch's
COMMIT (`bridge.nservicebus.deadletter.error_copy`: body unchanged, the raw Headers text in
`NServiceBus.Bridge.RawHeaders`, the failure headers). The copy and the delete of the original
commit together or not at all. Without an error queue, a layout that keeps failed rows in
their own table (`Layout.keeps_failed`: NGinn's `F` subqueue, with `error_info`) marks them
there instead, in the same transaction; under any other layout a rejected message with no
error queue to go to fails the commit: its row stays in the table.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from bridge.batch import Rejected
from bridge.envelope import PoisonMessage
from bridge.errors import TransportError
from bridge.nservicebus.deadletter import error_copy
from bridge.transports.sql.dialects.base import DbConnection, Dialect

__all__ = ["ErrorQueue"]


def _why(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


class ErrorQueue:
    """The error-queue writer of one source (table `address`); no error queue: writes nothing."""

    def __init__(self, dialect: Dialect, address: str, error_queue: str | None) -> None:
        self._dialect = dialect
        self._address = address
        self._error_queue = error_queue
        if error_queue is not None:
            dialect.table(error_queue)  # an impossible name fails now, not at the first poison

    def refuse_without_error_queue(self, rejected: Sequence[Rejected]) -> None:
        """Raise when messages were rejected but there is no error queue to copy them to, nor
        a layout that keeps them in their own table."""
        if rejected and self._error_queue is None and not self._dialect.layout.keeps_failed:
            raise TransportError("messages were rejected but this source has no error queue")

    def write(
        self, poison: Sequence[PoisonMessage], rejected: Sequence[Rejected], db: DbConnection
    ) -> None:
        """Insert the copies into the open transaction (on the connection's thread)."""
        self.refuse_without_error_queue(rejected)  # the failed call rolls back
        if not (poison or rejected):
            return
        if self._error_queue is None:
            if self._dialect.layout.keeps_failed:  # in their own table (NGinn's `F`)
                failed = [(p.native_id or "", p.reason) for p in poison]
                failed += [(r.envelope.native_id or "", _why(r.error)) for r in rejected]
                self._dialect.layout.keep_failed(db, self._address, failed)
            return
        statement = self._dialect.send_statement(db, self._error_queue)
        failed_q = self._dialect.canonical_address(self._address)
        now = time.time()
        outgoing, send_params = self._dialect.layout.outgoing, self._dialect.send_params
        copies = [error_copy(p, p.reason, failed_q) for p in poison]
        copies += [error_copy(r.envelope, r.error, failed_q) for r in rejected]
        address = self._error_queue
        rows = [send_params(outgoing(copy, now, address=address)) for copy in copies]
        db.cursor().executemany(statement, rows)
