"""Where published events go when they cross to Kafka: once to the topic of their type.

A Kafka endpoint's proxy that carries events (`bridge.config.pubsub`: the *carrier* of the
Kafka subscribers of an event) receives each published event once, however many Kafka endpoints
subscribe to it. `EventTopics` is the sink of that proxy's route: a message with
`NServiceBus.MessageIntent = Publish` whose types (`NServiceBus.EnclosedMessageTypes`) include
events the proxy carries is produced to the topic of each of those events, once each, headers
intact; every other message goes to the endpoint's own topic, as any route sends it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from bridge.envelope import Envelope
from bridge.errors import MessageRejected, MessagesRejected
from bridge.nservicebus.events import is_published, topics_of
from bridge.protocols import Checkpoint, Sink

__all__ = ["EventTopics"]


class EventTopics:
    """A sink that sends published events to their topics (see the module docstring)."""

    def __init__(self, own: Sink, topics: Mapping[str, str], sink: Callable[[str], Sink]) -> None:
        self._own = own
        self._topics = dict(topics)  # event type -> its topic
        self._make = sink
        self._sinks: dict[str, Sink] = {}

    def _sink(self, topic: str) -> Sink:
        if topic not in self._sinks:
            self._sinks[topic] = self._make(topic)
        return self._sinks[topic]

    def destinations(self, envelope: Envelope) -> list[str | None]:
        """The topics `envelope` goes to; [None]: the endpoint's own."""
        if is_published(envelope.headers):
            found = [self._topics[t] for t in topics_of(envelope.headers) if t in self._topics]
            if found:
                return list(dict.fromkeys(found))
        return [None]

    async def send(
        self, envelopes: Sequence[Envelope], checkpoint: Checkpoint | None = None
    ) -> None:
        groups: dict[str | None, list[int]] = {}
        for index, envelope in enumerate(envelopes):
            for topic in self.destinations(envelope):
                groups.setdefault(topic, []).append(index)
        for topic, indexes in groups.items():
            sink = self._own if topic is None else self._sink(topic)
            try:
                await sink.send([envelopes[i] for i in indexes])
            except MessageRejected as exc:
                raise _renumbered(exc, indexes) from exc
        if checkpoint:
            await self._own.send([], checkpoint)

    async def close(self) -> None:
        for sink in (self._own, *self._sinks.values()):
            await sink.close()


def _renumbered(exc: MessageRejected, indexes: Sequence[int]) -> MessageRejected:
    """`exc` with each index of a group turned into the index in the whole send. What other
    groups sent is not said to be accepted: the runner sends it again (at-least-once)."""

    def one(rejection: MessageRejected) -> MessageRejected:
        index = rejection.index
        return MessageRejected(str(rejection), index=None if index is None else indexes[index])

    if isinstance(exc, MessagesRejected):
        return MessagesRejected([one(r) for r in exc.rejections], rest_accepted=False)
    return one(exc)
