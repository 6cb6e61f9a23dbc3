"""Quorum queues the bridge receives from keep an unlimited delivery limit, as NServiceBus does.

Why: a quorum queue counts every return of a message (a `basic.nack` with requeue, a channel
or connection lost with the message unacknowledged) and drops or dead-letters it once the
count passes the queue's delivery limit. RabbitMQ 4.0 gives every quorum queue a limit of 20
by default; the bridge returns a whole batch, and the deliveries prefetched behind it, every
time a send to the destination fails, so about 20 failed attempts would lose messages.
NServiceBus RabbitMQ therefore checks each queue it receives from at start
(`BrokerVerifier.ValidateDeliveryLimit`, called by its message pump) and the bridge does the
same for every quorum queue a route receives from: at `bridge install` and whenever a source
starts consuming on a new channel (`source.py`).

The decision (`verdict`), as BrokerVerifier.cs:164-221 (NServiceBus.RabbitMQ@ec745bf) makes it:
- Only quorum queues are looked at; classic queues have no delivery limit.
- The limit is what RabbitMQ 4 reports (`delivery_limit`); on RabbitMQ 3, which reports none,
  the smaller of the `x-delivery-limit` argument and the effective policy's `delivery-limit`
  (a negative value counts as 0), and unlimited when neither is set (Queue.cs:35-69).
- `UNLIMITED` (100,000, the value of the transport's policy) is fine as it is.
- A limit set by the queue's argument, a user policy or an operator policy is refused: the
  bridge does not override what someone chose.
- Otherwise (RabbitMQ 4's default), the policy `nsb.<queue>.delivery-limit` is created:
  pattern `^<queue>$`, apply-to `quorum_queues`, priority 0, definition
  `{"delivery-limit": 100000}`, the very policy NServiceBus creates, so an endpoint that
  receives from the same queue accepts it. It is refused before RabbitMQ 4.0 (3.x cannot
  apply a policy to quorum queues only) and when another policy already applies to the queue
  (RabbitMQ applies one policy per queue, so it would replace that one). A transport policy
  of an older NServiceBus (`delivery-limit: -1`) is rewritten.

The management API (`management.py`) is the only place RabbitMQ says which policy applies.
Right after a queue is declared the API does not know it yet (the management database lags
by its statistics interval, 5 s by default), so the details are read again until it does, as
NServiceBus does; on RabbitMQ 3 with no policy at all in the vhost, nothing can apply and the
queue's arguments (known at once) decide.

When the management API cannot be read (no plugin, refused credentials) or the policy cannot be
written (the user lacks the `policymaker` tag), the queue is refused with an error saying what
to do, as NServiceBus refuses to start: the limit cannot be known, or is 20. An API that does
not answer, or answers with a server error, is `TransportUnavailable` (retried): a restarting
broker stops its plugins too; refused credentials (401, 403) are `AccessRefused`, an https
API whose certificate does not verify `TlsRefused`, any other answer a `TransportError`.
`validate_delivery_limits: false` skips all of this with a warning, as NServiceBus's
`ValidateDeliveryLimits = false` does (BrokerVerifier.cs:119-123).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

from bridge.errors import AccessRefused, TlsRefused, TransportError, TransportUnavailable
from bridge.transports.rabbitmq.config import RabbitMQConnection
from bridge.transports.rabbitmq.management import ManagementApi, ManagementError, curl

__all__ = [
    "UNLIMITED",
    "DeliveryLimits",
    "Verdict",
    "broker_version",
    "delivery_limit",
    "escape_pattern",
    "policy_for",
    "policy_name",
    "verdict",
]

log = logging.getLogger("bridge.rabbitmq")

#: What NServiceBus sets instead of an unlimited limit (Queue.cs:71): RabbitMQ 4.0 and 4.1
#: refuse -1 in a policy.
UNLIMITED = 100_000
#: The first RabbitMQ version that limits quorum queues by default and has `quorum_queues`
#: policies (BrokerVerifier.cs:14).
VERSION_4 = (4, 0)
#: How long the queue's details may take to reach the management database, and how often
#: they are read meanwhile.
DETAILS_WAIT = 60.0
DETAILS_POLL = 0.5

#: What to do about a limit that cannot be checked or lifted, appended to every refusal.
_REMEDY = (
    "the bridge returns a batch to its queue whenever a send fails, and a quorum queue drops "
    "a message returned more often than its delivery limit"
)
_ACCESS_REMEDY = (
    "enable the management plugin (rabbitmq-plugins enable rabbitmq_management), give the "
    "user the `management` and `policymaker` tags, set `management_url` if the API is "
    "elsewhere, or set `validate_delivery_limits: false` to skip this check and risk losing "
    "messages"
)


def policy_name(queue: str) -> str:
    """The transport's policy for `queue` (BrokerVerifier.cs:203)."""
    return f"nsb.{queue}.delivery-limit"


def is_transport_policy(name: object) -> bool:
    """Whether `name` is a policy NServiceBus (or the bridge) made (BrokerVerifier.cs:223)."""
    return isinstance(name, str) and name.startswith("nsb.") and name.endswith(".delivery-limit")


#: What .NET's Regex.Escape escapes (BrokerVerifier.cs:209 escapes the name with it): its
#: metacharacters, and white space, four of them by name.
_NAMED_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r", "\f": "\\f"}
_METACHARACTERS = frozenset("\\*+?|{[()^$.# ")


def escape_pattern(queue: str) -> str:
    """`queue` as a regular expression matching only itself, written as .NET writes it."""
    out = []
    for ch in queue:
        if ch in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[ch])
        elif ch in _METACHARACTERS:
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def policy_for(queue: str) -> dict[str, Any]:
    """The policy body NServiceBus PUTs for `queue` (BrokerVerifier.cs:205-211, Policy.cs)."""
    return {
        "pattern": f"^{escape_pattern(queue)}$",
        "apply-to": "quorum_queues",
        "definition": {"delivery-limit": UNLIMITED},
        "priority": 0,
    }


def _limit(value: object, source: str) -> int | None:
    """A delivery limit as the management API writes it: a number, or "unlimited" (-1)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{source}: {value!r} is not a delivery limit")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.lower() == "unlimited":
        return -1
    raise ValueError(f"{source}: {value!r} is not a delivery limit")


def _argument_limit(queue: Mapping[str, Any]) -> int | None:
    arguments = queue.get("arguments") or {}
    return _limit(arguments.get("x-delivery-limit"), "x-delivery-limit")


def _policy_limit(queue: Mapping[str, Any]) -> int | None:
    definition = queue.get("effective_policy_definition") or {}
    if not isinstance(definition, Mapping):  # RabbitMQ writes an empty definition as []
        return None
    return _limit(definition.get("delivery-limit"), "delivery-limit")


def _set_by(queue: Mapping[str, Any]) -> str:
    """Who set the queue's delivery limit: its argument, a policy, both, or no one ("")."""
    found = []
    if (argument := _argument_limit(queue)) is not None:
        found.append(f"its x-delivery-limit argument ({argument})")
    if (policy := _policy_limit(queue)) is not None:
        names = [
            f"{kind} {queue[key]!r}"
            for kind, key in (("policy", "policy"), ("operator policy", "operator_policy"))
            if queue.get(key)
        ]
        found.append(f"{' and '.join(names) or 'a policy'} (delivery-limit {policy})")
    return " and ".join(found)


def delivery_limit(queue: Mapping[str, Any]) -> int:
    """The queue's delivery limit as NServiceBus reads it (Queue.cs:35-69); -1 is unlimited
    on RabbitMQ 4, `UNLIMITED` stands for "none" on RabbitMQ 3."""
    reported = _limit(queue.get("delivery_limit"), "delivery_limit")
    if reported is not None:  # RabbitMQ 4 says what applies
        return reported
    set_to = [v for v in (_policy_limit(queue), _argument_limit(queue)) if v is not None]
    if not set_to:
        return UNLIMITED
    return max(min(set_to), 0)  # RabbitMQ 3 treats a negative argument as 0


@dataclass(frozen=True)
class Verdict:
    """What to do about one queue: nothing, create the policy, or refuse with `reason`."""

    action: Literal["none", "policy", "refuse"]
    reason: str = ""


def verdict(queue: Mapping[str, Any], version: tuple[int, int]) -> Verdict:
    """What NServiceBus does about `queue` on a broker of `version` (BrokerVerifier.cs:164-201)."""
    name = queue.get("name")
    if queue.get("type") != "quorum":
        return Verdict("none")
    limit = delivery_limit(queue)
    if limit == UNLIMITED:
        return Verdict("none")
    applied = queue.get("policy")
    ours = is_transport_policy(applied)
    set_by = _set_by(queue)
    if set_by and not (limit == -1 and ours):
        return Verdict(
            "refuse",
            f"quorum queue {name!r} has a delivery limit of {limit}, set by {set_by}; "
            f"{_REMEDY}: remove the x-delivery-limit argument, and delivery-limit from the user "
            "and operator policies that apply to the queue",
        )
    if version < VERSION_4:
        return Verdict(
            "refuse",
            f"quorum queue {name!r} has a delivery limit of {limit}, and RabbitMQ "
            f"{version[0]}.{version[1]} cannot lift it with a quorum-queue policy; {_REMEDY}",
        )
    if applied and not ours:
        return Verdict(
            "refuse",
            f"quorum queue {name!r} has RabbitMQ 4's default delivery limit of {limit}, and the "
            f"bridge cannot lift it with the policy {policy_name(str(name))!r} because the "
            f"policy {applied!r} applies to the queue (one policy applies per queue); {_REMEDY}: "
            f'add "delivery-limit": {UNLIMITED} to {applied!r}',
        )
    return Verdict("policy")


def broker_version(text: object) -> tuple[int, int]:
    """Major and minor of `rabbitmq_version`, without its pre-release tail (as
    BrokerVerifier.cs:53-65 reads it)."""
    parts = str(text).split("-", 1)[0].split("+", 1)[0].split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        raise ValueError(f"unexpected RabbitMQ version {text!r}") from None


class DeliveryLimits:
    """Checks, and lifts where NServiceBus would, the delivery limit of quorum source queues of
    one connection (see the module docstring)."""

    def __init__(self, config: RabbitMQConnection, where: str) -> None:
        self._config = config
        self._where = where
        self._api = ManagementApi(config)

    @property
    def wanted(self) -> bool:
        """Whether this connection's sources are looked at: it declares quorum queues (a
        classic connection's queues are classic: `install` and `check` see to that)."""
        return self._config.queue_type == "quorum"

    def describe(self, queue: str) -> str:
        """What `ensure` may do for `queue`, for `bridge install --print-sql`: the policy's
        request to the management API, commented out, since whether it is made depends on
        what the broker says when `ensure` asks (`verdict`)."""
        path = f"api/policies/{{vhost}}/{quote(policy_name(queue), safe='')}"
        request = curl(self._api.endpoint, "PUT", path, policy_for(queue))
        return (
            f"# Only where RabbitMQ 4 limits quorum queue {queue!r} to its default delivery "
            "limit and no\n# other policy applies to it, `bridge install` lifts the limit with "
            "NServiceBus's policy\n# (it refuses a limit someone set; RabbitMQ 3 needs none; "
            f"the user needs the `policymaker` tag):\n# {request}"
        )

    async def ensure(self, queue: str) -> str | None:
        """Make sure `queue` cannot drop messages for being returned often; what was done, if
        anything. Raises `TransportError` naming the queue and what to do when it can."""
        if not self.wanted:
            return None
        if not self._config.validate_delivery_limits:
            log.warning(
                "%s: the delivery limit of queue %r is not checked (validate_delivery_limits: "
                "false); messages returned to it often may be lost",
                self._where,
                queue,
            )
            return None
        try:
            version = await self._broker_version()
            details = await self._details(queue, version)
            if details is None:
                return None
            decision = verdict(details, version)
            if decision.action == "refuse":
                raise TransportError(f"{self._where}: {decision.reason}")
            if decision.action == "none":
                return None
            name = policy_name(queue)
            await self._api.put_policy(name, policy_for(queue))
        except ManagementError as exc:
            raise self._unreachable(queue, exc) from None
        except ValueError as exc:  # an answer that is not what the management API writes
            raise TransportError(f"{self._where}: queue {queue!r}: {exc}") from None
        log.info("%s: created the policy %r (delivery-limit %d)", self._where, name, UNLIMITED)
        return f"policy {name!r}"

    def _unreachable(self, queue: str, error: ManagementError) -> TransportError:
        """The error for a management API that could not be used. One that did not answer,
        or answered with a server error, may be a broker restarting (its plugins stop and start
        with it): that is retried."""
        if error.status == 404:
            problem = "found nothing there (is it the management API?)"
        elif error.status in (401, 403):
            problem = "refused the request"
        else:
            problem = "could not be used"
        passing = error.status is None or error.status >= 500
        kind: type[TransportError] = TransportUnavailable if passing else TransportError
        if error.status in (401, 403):
            kind = AccessRefused
        if error.tls_refused:
            kind = TlsRefused
            problem = "could not be reached safely"
        return kind(
            f"{self._where}: cannot check the delivery limit of quorum queue {queue!r}: the "
            f"RabbitMQ management API at {self._api.address} {problem} ({error}); {_REMEDY}. "
            f"To fix: {_ACCESS_REMEDY}"
        )

    async def _broker_version(self) -> tuple[int, int]:
        """Asked at every check: the broker may have been upgraded since the last one."""
        overview = await self._api.overview()
        return broker_version(overview.get("rabbitmq_version"))

    async def _details(self, queue: str, version: tuple[int, int]) -> dict[str, Any] | None:
        """The queue's details once the management database knows its policy (see the module
        docstring); None when there is no such queue (consuming from it fails as it always
        did, with AMQP's NOT_FOUND and the advice to run `bridge install`)."""
        deadline = time.monotonic() + DETAILS_WAIT
        no_policies: bool | None = None
        while True:
            try:
                details = await self._api.queue(queue)
            except ManagementError as exc:
                if exc.status == 404:
                    return None
                raise
            if details.get("type") != "quorum" or "effective_policy_definition" in details:
                return details
            if version < VERSION_4:
                if no_policies is None:
                    no_policies = await self._vhost_has_no_policies()
                if no_policies:
                    return {**details, "effective_policy_definition": {}, "policy": None}
            if time.monotonic() >= deadline:
                raise TransportError(
                    f"{self._where}: the management API at {self._api.address} did not say "
                    f"within {DETAILS_WAIT:.0f}s which policy applies to queue {queue!r}"
                )
            await asyncio.sleep(DETAILS_POLL)

    async def _vhost_has_no_policies(self) -> bool:
        """Whether no user or operator policy exists in the vhost (False when not allowed to
        list them: then the queue's details are waited for)."""
        try:
            return not await self._api.policies() and not await self._api.operator_policies()
        except ManagementError as exc:
            if exc.status in (401, 403):
                return False
            raise
