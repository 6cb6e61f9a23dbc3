"""Sending one batch to the sink, with the route's rules applied and per-message refusals.

Refusals
    A message refused for good (`MessageRejected`, by the route's rules or by the destination)
    is rejected on the batch (it goes to the error queue, or the source table's failed rows,
    when the batch commits) and the rest is sent again. When the sink names which messages it
    refused, only those are rejected; when it also says it accepted the rest
    (`MessagesRejected.rest_accepted`), the rest is not sent again; when it cannot say which,
    each message is sent alone to find out. Any other error leaves here unhandled, so the batch
    aborts, its rejected messages with it.

This module sends and rejects; it never commits: the caller commits the batch after `send`
returned (`bridge.routing.forwarding`).
"""

from __future__ import annotations

from bridge.envelope import Envelope
from bridge.errors import MessageRejected, MessagesRejected
from bridge.protocols import ReceivedBatch, Sink
from bridge.routing.rules import RouteRules
from bridge.telemetry.tracing import RouteTracing

__all__ = ["BatchSender"]


class BatchSender:
    """Sends a route's batches: each message rewritten by `rules` and `tracing`."""

    def __init__(self, rules: RouteRules, tracing: RouteTracing) -> None:
        self._rules = rules
        self._tracing = tracing

    async def send(
        self,
        batch: ReceivedBatch,
        sink: Sink,
        originals: list[Envelope],
        refused: list[BaseException],
    ) -> list[Envelope]:
        """Send the batch; a message refused for good is rejected and the rest sent again.

        Returns what the destination accepted; `refused` gets the reason of each rejection.
        When the sink cannot say which message it refused, each is sent alone to find out; when
        it says it accepted the rest (`MessagesRejected.rest_accepted`), the rest is not sent
        again.
        """
        if self._rules.identity and not self._tracing.enabled:
            pairs = [(original, original) for original in originals]  # nothing to rewrite
        else:
            pairs = self._rewrite(batch, originals, refused)
        while True:
            try:
                if pairs or batch.checkpoint:
                    await sink.send([out for _, out in pairs], batch.checkpoint)
                return [out for _, out in pairs]
            except MessageRejected as exc:
                named = _refused(exc, len(pairs))
                if named:
                    for index, rejection in sorted(named.items()):
                        batch.reject(pairs[index][0], rejection)
                        refused.append(rejection)
                    pairs = [pair for i, pair in enumerate(pairs) if i not in named]
                    if isinstance(exc, MessagesRejected) and exc.rest_accepted:
                        if batch.checkpoint:
                            await sink.send([], batch.checkpoint)
                        return [out for _, out in pairs]
                    continue
                if len(pairs) <= 1:
                    if pairs:
                        batch.reject(pairs.pop()[0], exc)
                        refused.append(exc)
                    continue
            return await _send_one_by_one(batch, sink, pairs, refused)

    def _rewrite(
        self, batch: ReceivedBatch, originals: list[Envelope], refused: list[BaseException]
    ) -> list[tuple[Envelope, Envelope]]:
        """Each message with the route's rules applied; one they refuse is rejected."""
        forward = self._tracing.forward
        pairs = []
        for original in originals:
            try:
                pairs.append((original, forward(self._rules(original))))
            except MessageRejected as exc:
                batch.reject(original, exc)
                refused.append(exc)
        return pairs


def _refused(exc: MessageRejected, count: int) -> dict[int, MessageRejected]:
    """Each refused message's index and error; empty when `exc` does not name them all."""
    each = exc.rejections if isinstance(exc, MessagesRejected) else (exc,)
    refused = {r.index: r for r in each if r.index is not None and 0 <= r.index < count}
    return refused if len(refused) == len(each) else {}


async def _send_one_by_one(
    batch: ReceivedBatch,
    sink: Sink,
    pairs: list[tuple[Envelope, Envelope]],
    refused: list[BaseException],
) -> list[Envelope]:
    accepted = []
    for original, out in pairs:
        try:
            await sink.send([out])
            accepted.append(out)
        except MessageRejected as exc:
            batch.reject(original, exc)
            refused.append(exc)
    if batch.checkpoint:
        await sink.send([], batch.checkpoint)
    return accepted
