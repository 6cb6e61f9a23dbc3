"""Publisher confirms: each published message's delivery tag matched to its publish and index.

A channel in confirm mode numbers the messages published on it from 1; the broker confirms
(`basic.ack`) or refuses (`basic.nack`) each tag, or several at once with `multiple`, and
returns an unroutable message (`basic.return`, when sent with `mandatory=True`, as every send
is; a publish of events is not) before its confirm.
A `publish` completes once every one of its messages is confirmed, with the indexes that came
back unroutable (matched by `message_id` in publish order) and how many were nacked. Everything
here runs on the session's ioloop thread.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import pika
from pika import spec

from bridge.errors import BridgeError, MessageRejected
from bridge.transports.rabbitmq.errors import oversized_body, translate
from bridge.transports.rabbitmq.handoff import Done

__all__ = ["Confirms", "Message", "Publish", "PublishOutcome", "Routes"]

log = logging.getLogger("bridge.rabbitmq")

Message = tuple[pika.BasicProperties, bytes]
#: Where each message of a publish goes, by index, when not to the publish's exchange and
#: routing key: (exchange, routing key), or None for the publish's own.
Routes = Sequence[tuple[str, str] | None] | None


@dataclass(slots=True)
class PublishOutcome:
    """What the broker said about one `publish`: returned indexes, nack count, reply text."""

    returned: list[int] = field(default_factory=list)
    nacked: int = 0
    return_text: str = ""


class Publish:
    """One `publish` in flight: counts confirms, matches returns to indexes."""

    def __init__(self, done: Done, messages: Sequence[Message]) -> None:
        self.done = done
        self.ids = [properties.message_id for properties, _ in messages]
        self.sizes = [len(body) for _, body in messages]
        self.unconfirmed: set[int] = set()
        self.outcome = PublishOutcome()
        self._scan = 0

    def match_return(self, message_id: str | None, text: str) -> bool:
        for index in range(self._scan, len(self.ids)):
            if self.ids[index] == message_id and index in self.unconfirmed:
                self._scan = index + 1
                self.outcome.returned.append(index)
                self.outcome.return_text = text
                return True
        return False

    def confirmed(self, index: int, nack: bool) -> None:
        self.unconfirmed.discard(index)
        if nack:
            self.outcome.nacked += 1
        if not self.unconfirmed:
            self.done.ok(self.outcome)

    def channel_lost(self, reason: BaseException, error: BridgeError) -> None:
        size = oversized_body(reason)
        if size is not None and self.unconfirmed:
            pending = sorted(self.unconfirmed)
            index = next((i for i in pending if self.sizes[i] == size), None)
            if index is None:
                index = max(pending, key=lambda i: self.sizes[i])
            error = MessageRejected(str(error), index=index)
        self.done.fail(error)


class Confirms:
    """The publishes in flight on one session's channel, by delivery tag."""

    def __init__(self, where: str) -> None:
        self.where = where
        self._publishes: list[Publish] = []
        self._unconfirmed: dict[int, tuple[Publish, int]] = {}
        self._next_tag = 1

    def channel_ready(self) -> None:
        """A new channel in confirm mode: its delivery tags start at 1."""
        self._next_tag = 1

    def publish(
        self,
        channel: pika.channel.Channel,
        done: Done,
        exchange: str,
        routing_key: str,
        messages: Sequence[Message],
        routes: Routes = None,
        mandatory: bool = True,
    ) -> bool:
        """Publish every message with `mandatory` (a message no queue takes comes back) to
        `exchange` with `routing_key`, or where `routes` says for its index; `done` settles with
        the outcome once all are confirmed. True when frames were handed to pika (nothing
        failed, something to send).
        """
        state = Publish(done, messages)
        if not messages:
            done.ok(state.outcome)
            return False
        self._publishes.append(state)
        for index, (properties, body) in enumerate(messages):
            route = routes[index] if routes is not None else None
            to, key = (exchange, routing_key) if route is None else route
            try:
                channel.basic_publish(to, key, body, properties, mandatory=mandatory)
            except Exception as exc:  # nothing of this message went out (pika marshals first)
                self._publishes.remove(state)
                done.fail(translate(exc, self.where, index=index))
                return False
            self._unconfirmed[self._next_tag] = (state, index)
            state.unconfirmed.add(index)
            self._next_tag += 1
        return True

    def on_confirm(self, frame: pika.frame.Method) -> None:
        method = frame.method
        nack = isinstance(method, spec.Basic.Nack)
        tags: list[int]
        if method.multiple:
            tags = list(itertools.takewhile(lambda t: t <= method.delivery_tag, self._unconfirmed))
        else:
            tags = [method.delivery_tag]
        for tag in tags:
            entry = self._unconfirmed.pop(tag, None)
            if entry is None:
                continue
            state, index = entry
            state.confirmed(index, nack)
            if not state.unconfirmed and state in self._publishes:
                self._publishes.remove(state)

    def on_return(
        self,
        channel: pika.channel.Channel,
        method: spec.Basic.Return,
        properties: pika.BasicProperties,
        body: bytes,
    ) -> None:
        text = f"({method.reply_code}) {method.reply_text}"
        for state in self._publishes:
            if state.match_return(properties.message_id, text):
                return
        log.warning("%s: a returned message matched no publish in flight", self.where)

    def channel_lost(self, reason: BaseException, error: BridgeError) -> None:
        """The channel closed: every publish in flight fails (`reason` may name one message)."""
        publishes = self.forget()
        for publish in publishes:
            publish.channel_lost(reason, error)

    def forget(self) -> list[Publish]:
        """Drop every publish in flight (the caller fails them) and return them."""
        publishes, self._publishes = self._publishes, []
        self._unconfirmed.clear()
        return publishes
