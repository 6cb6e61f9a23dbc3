"""NGinn.MessageBus rows <-> envelopes on one connection (`RowMapping`): its alias, time zone
and type map, and the count of the headers its rows could not carry.

The mapping to NServiceBus headers is this project's contract (README, "NGinn.MessageBus
tables"): `incoming` makes an envelope of a row (`nginn_incoming`), `outgoing` a row of an
envelope (`nginn_outgoing`); `nginn_formats` holds NGinn's headers, times and body text.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from bridge.envelope import Envelope, PoisonMessage
from bridge.transports.sql.layouts import nginn_incoming, nginn_outgoing
from bridge.transports.sql.layouts.nginn_formats import endpoint, to_utc
from bridge.transports.sql.layouts.nginn_incoming import NGinnRow
from bridge.transports.sql.layouts.nginn_outgoing import LEFT_OUT, OutgoingNGinnRow

__all__ = ["RowMapping"]

log = logging.getLogger(__name__)


class RowMapping:
    """The mapping of one connection: its alias, time zone and type map."""

    def __init__(self, alias: str, zone: str, types: Mapping[str, str]) -> None:
        self.alias = alias
        self.zone = ZoneInfo(zone)
        self.types = dict(types)
        self._type_names = {nginn: name for name, nginn in types.items()}
        #: Headers left out of rows written so far (NGinn could not carry them).
        self.left_out = 0
        self._warned: set[str] = set()

    def endpoint(self, table: str) -> str:
        return endpoint(self.alias, table)

    def to_utc(self, local: datetime) -> datetime:
        return to_utc(local, self.zone)

    def received(self, rows: Sequence[Sequence[Any]]) -> list[NGinnRow]:
        """Result rows of the receive (see `nginn_sql`), oldest `retry_time` first."""
        return nginn_incoming.received(rows)

    def incoming(self, row: NGinnRow, now: float, table: str) -> Envelope | PoisonMessage:
        """The envelope of a live row, or a poison message when NGinn could not read it
        either: headers its reader throws on, a body that is not UTF-8 JSON, a bad `_NG-TTL`."""
        return nginn_incoming.incoming(row, now, self.endpoint(table), self.zone, self._type_names)

    def outgoing(self, envelope: Envelope, now: float, table: str) -> OutgoingNGinnRow:
        """The row for `envelope` in table `table`; HeadersFormatError for a message NGinn
        could not take (the sink rejects it: it goes to the error queue)."""
        row, left_out = nginn_outgoing.outgoing(
            envelope, now, table, alias=self.alias, zone=self.zone, types=self.types
        )
        if left_out:
            self._count(left_out)
        return row

    def _count(self, names: list[str]) -> None:
        self.left_out += len(names)
        new = [name for name in names if name not in self._warned]
        if new:
            self._warned.update(new)
            log.warning(
                "NGinn rows cannot carry header(s) %s (a `|` or `=`, a null value or padding "
                "spaces): left out, and counted in each row's %s header",
                ", ".join(sorted(set(new))),
                LEFT_OUT,
            )
