"""Events as NServiceBus names them: type names, topics, RabbitMQ exchanges, Kafka topics.

Facts (messaging-bridge.md §2):

- a published message carries `NServiceBus.MessageIntent = Publish`; the Messaging Bridge's
  proxies drop `Subscribe` and `Unsubscribe` control messages, the intent read without regard
  to case (EndpointProxyFactory.cs:27-29, 72-81 of Particular/NServiceBus.MessagingBridge@ef463cf);
- NGinn.MessageBus subscribes by sending the publisher a message (`SubscribeAt` and
  `UnsubscribeAt`, Impl/MessageBus.cs:500-508 of lafar6502/nginn-messagebus @1fa4baf) of class
  `NGinnBPM.MessageBus.Messages.SubscribeRequest` or `.UnsubscribeRequest`
  (Messages/SubscribeRequest.cs:6-11, UnsubscribeRequest.cs:6-8), which the publisher's
  `SubscriptionMsgHandler` turns into its subscription row (Impl/SubscriptionMsgHandler.cs:
  31-60); a row read from NGinn tables names its body's `$type` in `EnclosedMessageTypes`
  (`nginn_incoming`), by which a proxy drops these as it drops NServiceBus's;
- `NServiceBus.EnclosedMessageTypes` lists `;`-joined assembly-qualified names, most derived
  first; without .NET types, a message's topics are each entry's full name (the text before the
  first comma) and `System.Object`, which every class derives from (PolymorphicSubscriptionStore.cs:
  45-57 of Particular/NServiceBus.SqlServer@214c4e8f walks the base types up to it, then the
  interfaces); a message that names no type (a record a producer without NServiceBus wrote to
  an event's topic) is of the type its route reads (`published`), and its copies say so;
- the SQL transports' topic is the type's full name (TopicNames.cs:7), RabbitMQ's exchange
  `Namespace:Name` (ConventionalRoutingTopology.cs:19 of Particular/NServiceBus.RabbitMQ@ec745bf8);
- this project's Kafka convention: an event goes once to the topic of its type, the `events:`
  map's or its full name with every character outside `[A-Za-z0-9._-]` replaced by `_`, cut to
  249 characters.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from bridge.envelope import Envelope, Headers

__all__ = [
    "ENCLOSED_TYPES",
    "MESSAGE_INTENT",
    "NGINN_CONTROL",
    "OBJECT",
    "PUBLISH",
    "exchange_name",
    "intent",
    "is_control",
    "is_published",
    "kafka_topic",
    "mark_published",
    "published",
    "topics_of",
    "type_name_problem",
]

MESSAGE_INTENT = "NServiceBus.MessageIntent"
ENCLOSED_TYPES = "NServiceBus.EnclosedMessageTypes"
PUBLISH = "Publish"
OBJECT = "System.Object"
_CONTROL = ("subscribe", "unsubscribe")
#: NGinn's subscription requests, by their classes' full names.
NGINN_CONTROL = (
    "NGinnBPM.MessageBus.Messages.SubscribeRequest",
    "NGinnBPM.MessageBus.Messages.UnsubscribeRequest",
)

#: A C# identifier: a letter or `_`, then letters, digits or `_`, in any script (C# takes
#: Unicode letters: `Ventes.CommandePassée`); a generic type's arity after a backtick.
_IDENTIFIER = r"[^\W\d]\w*(?:`[0-9]+)?"
#: A .NET full name as written in routes.yaml: namespaces, the type, nested types after `+`.
_FULL_NAME = re.compile(rf"{_IDENTIFIER}(?:\.{_IDENTIFIER})*(?:\+{_IDENTIFIER})*")
_NOT_IN_TOPIC = re.compile(r"[^A-Za-z0-9._-]")
MAX_TOPIC = 249


def type_name_problem(name: str) -> str | None:
    """Why `name` is not a .NET full type name (`Sales.Messages.OrderPlaced`), or None."""
    if not _FULL_NAME.fullmatch(name):
        return (
            f"event {name!r} is not a .NET full type name: namespaces and the type name, "
            "separated by '.' (nested types after '+'), each a letter or '_' followed by "
            "letters, digits or '_' (a generic type's arity after '`': List`1)"
        )
    if len(name) > 200:
        return f"event {name[:40]!r}... is {len(name)} characters; SubscriptionRouting holds 200"
    return None


def intent(headers: Headers) -> str | None:
    return headers.get(MESSAGE_INTENT)


def is_control(headers: Headers) -> bool:
    """A Subscribe or Unsubscribe control message, as the Messaging Bridge recognises one, or
    NGinn's SubscribeRequest or UnsubscribeRequest (its type, the first enclosed one)."""
    value = intent(headers)
    if value is not None and value.strip().lower() in _CONTROL:
        return True
    enclosed = headers.get(ENCLOSED_TYPES)
    return bool(enclosed) and topics_of(headers)[0] in NGINN_CONTROL


def is_published(headers: Headers) -> bool:
    value = intent(headers)
    return value is not None and value.strip().lower() == PUBLISH.lower()


def topics_of(headers: Headers) -> list[str]:
    """The full names of the message's types, most derived first, then `System.Object`."""
    names: list[str] = []
    for entry in (headers.get(ENCLOSED_TYPES) or "").split(";"):
        name = entry.split(",", 1)[0].strip()
        if name and name not in names:
            names.append(name)
    if OBJECT not in names:
        names.append(OBJECT)
    return names


def published(envelope: Envelope, event: str | None = None) -> Envelope:
    """The copy of `envelope` a publisher sends: `NServiceBus.MessageIntent = Publish`, as every
    published copy carries (whatever the record said, or nothing); when it names no type,
    `event`'s (the event its route carries) in `NServiceBus.EnclosedMessageTypes`, so that
    subscribers are found by it and an NServiceBus subscriber knows what it got."""
    headers = envelope.headers.copy()
    headers.set(MESSAGE_INTENT, PUBLISH)
    if event and not (headers.get(ENCLOSED_TYPES) or "").strip():
        headers.set(ENCLOSED_TYPES, event)
    return dataclasses.replace(envelope, headers=headers)


def mark_published(headers: Headers, event: str) -> None:
    """Make `headers` those of `event` published: `NServiceBus.MessageIntent = Publish`, and
    `event` listed in `NServiceBus.EnclosedMessageTypes` after the types already there when it
    is not one of them (a derived class's copy: NServiceBus lists the base types after the
    derived one), so that subscribers of `event` find it by that name."""
    headers.set(MESSAGE_INTENT, PUBLISH)
    if event not in topics_of(headers):
        listed = (headers.get(ENCLOSED_TYPES) or "").strip()
        headers.set(ENCLOSED_TYPES, f"{listed};{event}" if listed else event)


def exchange_name(full_name: str) -> str:
    """The RabbitMQ exchange of a type: `Namespace:Name` (a nested type's Name is its own)."""
    namespace, _, name = full_name.split("+", 1)[0].rpartition(".")
    if "+" in full_name:
        name = full_name.rsplit("+", 1)[1]
    return f"{namespace}:{name}"


def kafka_topic(full_name: str, events: Mapping[str, str]) -> str:
    """The Kafka topic of an event type: `events:`'s, else derived from the full name."""
    mapped = events.get(full_name)
    if mapped:
        return mapped
    return _NOT_IN_TOPIC.sub("_", full_name)[:MAX_TOPIC]
