"""An NGinn.MessageBus process as the database sees it: its own statements, replayed verbatim.

The statement text below is NGinn's (lafar6502/nginn-messagebus @1fa4baf,
`NGinnBPM.MessageBus/Impl/SqlQueue/NamedQueries.sqlserver.json`), and so are the parameters
each call binds (`CommonQueueOps.cs`). NGinn ships no PostgreSQL or SQLite queries
(`NamedQueries.postgres.json` is a stub), so `translate` rewrites the few T-SQL forms they use
and nothing else: table hints (`with (UPDLOCK, READPAST)` becomes PostgreSQL's `FOR UPDATE
SKIP LOCKED`), `top n`, `getdate()` (the server's local time: PostgreSQL's `LOCALTIMESTAMP`
in a session whose time zone is the server's, SQLite's `nginn_now()` in the configured zone),
`[name]` and `@name` parameters.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import psycopg

__all__ = ["NGINN_QUERIES", "NGinn", "nginn_headers", "translate"]

#: NamedQueries.sqlserver.json, verbatim, by its keys (line numbers at @1fa4baf).
NGINN_QUERIES = {
    # :2
    "SelectAndLockNext1": (
        "select top 1 id, correlation_id, from_endpoint, to_endpoint, retry_count, msg_text, "
        "msg_headers, unique_id, retry_time from {0} with (UPDLOCK, READPAST) where "
        "subqueue='I' order by retry_time"
    ),
    # :4
    "SelectAndLockNext2": (
        "update {0} with(readpast, rowlock) set subqueue='X', last_processed = getdate() "
        "where id=@id and subqueue='I'"
    ),
    # :8
    "InsertMessageBatch_InsertSql": (
        "INSERT INTO {0} with(rowlock) ([from_endpoint], [to_endpoint],[subqueue],[insert_time],"
        "[last_processed],[retry_count],[retry_time],[error_info],[msg_text],[correlation_id],"
        "[label], [msg_headers], [unique_id]) VALUES (@from_endpoint{1}, @to_endpoint{1}, "
        "@subqueue{1}, getdate(), null, 0, @retry_time{1}, null, @{2}, @correl_id{1}, "
        "@label{1}, @headers{1}, @unique_id{1});"
    ),
    # :27
    "SqlSubscriptionService_GetSubscriptions": (
        "select subscriber_endpoint, message_type from {0} where publisher_endpoint=@pub and "
        "(expiration_date is null or expiration_date >= getdate())"
    ),
    # :16
    "MoveScheduledMessagesToInputQueue": (
        "update top (1000) {0} with(READPAST) set subqueue='I' where subqueue='R' and "
        "retry_time <= getdate()"
    ),
}

_HINT = re.compile(r"\s*with\s*\(([^)]*)\)", re.IGNORECASE)
_UPDATE_TOP = re.compile(
    r"^update top \((\d+)\) (\S+) set (.*) where (.*)$", re.IGNORECASE | re.DOTALL
)
_SELECT_TOP = re.compile(r"^select top (\d+) (.*)$", re.IGNORECASE | re.DOTALL)


def translate(statement: str, kind: str) -> str:
    """NGinn's T-SQL `statement` for PostgreSQL or SQLite (see the module docstring)."""
    pg = kind == "postgresql"
    hints = " ".join(_HINT.findall(statement)).upper()
    skip_locked = " FOR UPDATE SKIP LOCKED" if pg and "READPAST" in hints else ""
    text = _HINT.sub("", statement).strip().rstrip(";")
    text = re.sub(r"getdate\(\)", "LOCALTIMESTAMP" if pg else "nginn_now()", text, flags=re.I)
    text = re.sub(r"\[(\w+)\]", r"\1", text)
    text = re.sub(r"@(\w+)", r"%(\1)s" if pg else r":\1", text)
    if match := _SELECT_TOP.match(text):
        text = f"select {match[2]} limit {match[1]}{skip_locked}"
    elif match := _UPDATE_TOP.match(text):
        n, table, assignments, where = match.groups()
        text = (
            f"update {table} set {assignments} where id in "
            f"(select id from {table} where {where} limit {n}{skip_locked})"
        )
    return text


def nginn_headers(text: str | None) -> dict[str, str]:
    """`MessageContainer.HeadersString`'s setter (Impl/IMessageTransport.cs:122-136)."""
    headers: dict[str, str] = {}
    for pair in (text or "").split("|"):
        if not pair:
            continue
        nv = pair.split("=")
        if len(nv) != 2:
            raise ValueError(f"Invalid header string: {pair}")
        headers[nv[0].strip()] = nv[1].strip()
    return headers


@dataclass
class Received:
    id: int
    from_endpoint: str
    to_endpoint: str
    headers: dict[str, str]
    body: str
    unique_id: str | None
    correlation_id: str | None


class NGinn:
    """One NGinn endpoint (`sql://<alias>/<table>`) on a PostgreSQL schema or SQLite file,
    its clock in `zone` (the database server's time zone)."""

    def __init__(self, kind: str, where: str, table: str, zone: str, alias: str = "db") -> None:
        self.kind = kind
        self.where = where  # PostgreSQL: "dsn|schema"; SQLite: the file
        self.table = table
        self.zone = ZoneInfo(zone)
        self.endpoint = f"sql://{alias}/{table}"

    def quoted(self, table: str | None = None) -> str:
        """The table's quoted name, fit for statements with parameters (psycopg's `%%`)."""
        name = '"' + (table or self.table).replace('"', '""') + '"'
        if self.kind == "postgresql":
            return f'"{self.where.split("|")[1]}".{name}'.replace("%", "%%")
        return name

    def now(self) -> datetime:
        """`DateTime.Now` on a machine in the server's zone."""
        return datetime.now(self.zone).replace(tzinfo=None)

    @contextmanager
    def connection(self) -> Iterator[Any]:
        if self.kind == "postgresql":
            dsn = self.where.split("|")[0]
            with psycopg.connect(dsn) as db:
                db.execute(f"SET TIME ZONE '{self.zone.key}'")
                yield db
        else:
            file = sqlite3.connect(self.where, timeout=30, isolation_level=None)
            zone = self.zone
            file.create_function(
                "nginn_now",
                0,
                lambda: datetime.now(zone).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
            )
            try:
                file.execute("BEGIN IMMEDIATE")
                yield file
                file.execute("COMMIT")
            finally:
                file.close()

    def _run(self, db: Any, name: str, params: Mapping[str, Any], table: str | None = None) -> Any:
        statement = NGINN_QUERIES[name].format(self.quoted(table), 0, "msg_body0")
        return db.execute(translate(statement, self.kind), dict(params))

    def _time(self, moment: datetime) -> Any:
        return moment if self.kind == "postgresql" else moment.isoformat(" ", "milliseconds")

    def send(
        self,
        body: str,
        headers: str = "",
        *,
        to: str | None = None,
        unique_id: str | None = None,
        correlation_id: str | None = None,
        deliver_at: datetime | None = None,
        label: str = "",
        from_endpoint: str = "sql://db/Sender",
    ) -> None:
        """`InsertMessageBatchToLocalDatabaseQueues` for one message (CommonQueueOps.cs:132-150):
        subqueue R with its delivery time when scheduled, else I at `DateTime.Now`."""
        with self.connection() as db:
            self.insert(
                db,
                body,
                headers,
                to=to,
                unique_id=unique_id,
                correlation_id=correlation_id,
                deliver_at=deliver_at,
                label=label,
                from_endpoint=from_endpoint,
            )

    def insert(
        self,
        db: Any,
        body: str,
        headers: str = "",
        *,
        to: str | None = None,
        unique_id: str | None = None,
        correlation_id: str | None = None,
        deliver_at: datetime | None = None,
        label: str = "",
        from_endpoint: str = "sql://db/Sender",
    ) -> None:
        self._run(
            db,
            "InsertMessageBatch_InsertSql",
            {
                "from_endpoint0": from_endpoint,
                "to_endpoint0": to or self.endpoint,
                "subqueue0": "R" if deliver_at else "I",
                "retry_time0": self._time(deliver_at or self.now()),
                "msg_body0": body,
                "correl_id0": correlation_id,
                "label0": label,
                "headers0": headers,
                "unique_id0": unique_id,
            },
        )

    def subscriptions(self, table: str) -> dict[str, list[str]]:
        """`SqlSubscriptionService.GetTargetEndpoints`' load (SqlSubscriptionService.cs:63-101):
        message type -> subscriber endpoints of this endpoint, read from subscription table
        `table`."""
        with self.connection() as db:
            statement = NGINN_QUERIES["SqlSubscriptionService_GetSubscriptions"]
            text = translate(statement.format(self.quoted(table)), self.kind)
            found: dict[str, list[str]] = {}
            for subscriber, message_type in db.execute(text, {"pub": self.endpoint}).fetchall():
                targets = found.setdefault(message_type, [])
                if subscriber not in targets:
                    targets.append(subscriber)
            return found

    def notify(
        self,
        body: str,
        chain: list[str],
        subscriptions: str,
        unique_ids: list[str],
        correlation_id: str | None = None,
    ) -> list[str]:
        """`Notify` of a message whose class chain (most derived first, up to System.Object) is
        `chain`: `GetTargetQueuesForMessageType` (MessageBus.cs:264-287) unions the subscribers
        of each class, then `NotifyAndDistributeMessages` (:347-371) sends one row per target,
        `from_endpoint` this endpoint, the first with the message's unique id and each clone
        with a new one (`unique_ids`, in order), no correlation id (`correlation_id`: the
        fluent `NewMessage(m).SetCorrelationId(id).Publish()`, :652-656, 714-737); each row into
        the target's table (a local database queue). The targets, in order."""
        found = self.subscriptions(subscriptions)
        targets: list[str] = []
        for name in chain:
            for endpoint in found.get(name, []):
                if endpoint not in targets:
                    targets.append(endpoint)
        with self.connection() as db:
            for target, unique_id in zip(targets, unique_ids, strict=False):
                params = {
                    "from_endpoint0": self.endpoint,
                    "to_endpoint0": target,
                    "subqueue0": "I",
                    "retry_time0": self._time(self.now()),
                    "msg_body0": body,
                    "correl_id0": correlation_id,
                    "label0": "",
                    "headers0": "",
                    "unique_id0": unique_id,
                }
                self._run(db, "InsertMessageBatch_InsertSql", params, target.rsplit("/", 1)[1])
        return targets

    def receive(self, table: str | None = None) -> Received | None:
        """`SelectAndLockNextInputMessage` (CommonQueueOps.cs:39-75): select and lock the
        oldest `I` row, then mark it `X`; None when there is none."""
        with self.connection() as db:
            return self.receive_in(db, table)

    def receive_in(self, db: Any, table: str | None = None) -> Received | None:
        row = self._run(db, "SelectAndLockNext1", {}, table).fetchone()
        if row is None:
            return None
        id_, correlation, sender, to, _retries, text, headers, unique, _due = row
        done = self._run(db, "SelectAndLockNext2", {"id": id_}, table)
        assert done.rowcount == 1
        return Received(id_, sender, to, nginn_headers(headers), text, unique, correlation)

    def move_scheduled(self) -> int:
        """`MoveScheduledMessagesToInputQueue` (CommonQueueOps.cs:307-323)."""
        with self.connection() as db:
            return int(self._run(db, "MoveScheduledMessagesToInputQueue", {}).rowcount)

    def rows(self, table: str | None = None) -> list[dict[str, Any]]:
        """Every row of the table, by id, as a dictionary of its columns."""
        with self.connection() as db:
            cursor = db.execute(f"SELECT * FROM {self.quoted(table)} ORDER BY id", ())
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def execute(self, statement: str, params: Any = ()) -> None:
        with self.connection() as db:
            db.execute(statement.replace("{0}", self.quoted()), params)
