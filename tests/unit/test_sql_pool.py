"""`bridge.transports.sql.pool.Pool` on its own: its bound, the order of waiting leases, its
timeout, what a discarded or failed connection frees, and close. The connections are real
in-memory SQLite ones (shareable between threads); the pool never looks inside them."""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import cast

import pytest

from bridge.errors import TransportUnavailable
from bridge.transports.sql.dialects.base import DbConnection
from bridge.transports.sql.dialects.sqlserver import TrackedConnection
from bridge.transports.sql.pool import Pool


class Opened:
    """`connect` for a pool, remembering every connection it opened."""

    def __init__(self, fail: int = 0) -> None:
        self.connections: list[sqlite3.Connection] = []
        self.fail = fail  # this many connects fail first

    def __call__(self) -> DbConnection:
        if self.fail:
            self.fail -= 1
            raise sqlite3.OperationalError("unable to open database file")
        db = sqlite3.connect(":memory:", check_same_thread=False)
        self.connections.append(db)
        return cast(DbConnection, db)


def closed(db: object) -> bool:
    try:
        cast(sqlite3.Connection, db).execute("SELECT 1")
    except sqlite3.ProgrammingError:
        return True
    return False


def lease_in_thread(pool: Pool, got: list[object], name: str) -> threading.Thread:
    def lease() -> None:
        try:
            got.append((name, pool.lease()))
        except TransportUnavailable as exc:
            got.append((name, exc))

    thread = threading.Thread(target=lease)
    thread.start()
    return thread


def wait_for_waiters(pool: Pool, count: int) -> None:
    deadline = time.monotonic() + 5
    while len(pool._waiters) < count:
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_at_most_size_are_opened_and_what_is_given_back_is_leased_again() -> None:
    opened = Opened()
    pool = Pool(opened, 2, 5.0, "test")
    first, second = pool.lease(), pool.lease()
    assert pool.open == 2 and not pool.free()
    pool.give_back(first)
    assert pool.free()
    assert pool.lease() is first  # an idle one before a new one
    assert len(opened.connections) == 2
    pool.give_back(first)
    pool.give_back(second)
    assert pool.idle == 2


def test_waiting_leases_are_served_first_come_first_served() -> None:
    pool = Pool(Opened(), 1, 5.0, "test")
    held = pool.lease()
    got: list[object] = []
    threads = []
    for name in ("a", "b", "c"):
        threads.append(lease_in_thread(pool, got, name))
        wait_for_waiters(pool, len(threads))
    for served in range(1, len(threads) + 1):  # each one given back goes to the next waiting
        pool.give_back(held)
        deadline = time.monotonic() + 5
        while len(got) < served:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        held = cast(DbConnection, cast(tuple[str, object], got[-1])[1])
    for thread in threads:
        thread.join()
    assert [name for name, _ in cast(list[tuple[str, object]], got)] == ["a", "b", "c"]


def test_a_lease_waits_at_most_the_timeout_then_fails_retriably() -> None:
    pool = Pool(Opened(), 1, 0.2, "postgresql connection 'shop'")
    pool.lease()
    started = time.monotonic()
    with pytest.raises(TransportUnavailable, match="no free connection in its pool of 1") as raised:
        pool.lease()
    assert raised.value.retriable
    assert 0.15 < time.monotonic() - started < 2.0
    assert not pool._waiters  # it stopped waiting


def test_a_discarded_connection_is_closed_and_frees_its_place_for_a_waiting_lease() -> None:
    opened = Opened()
    pool = Pool(opened, 1, 5.0, "test")
    broken = pool.lease()
    got: list[object] = []
    thread = lease_in_thread(pool, got, "waiting")
    wait_for_waiters(pool, 1)
    pool.discard(broken)
    thread.join(5)
    ((_, new),) = cast(list[tuple[str, object]], got)
    assert closed(broken) and new is not broken and not closed(new)
    assert pool.open == 1 and len(opened.connections) == 2


def test_a_failed_connect_frees_its_place() -> None:
    pool = Pool(Opened(fail=1), 1, 0.2, "test")
    with pytest.raises(sqlite3.OperationalError):
        pool.lease()
    assert pool.open == 0
    pool.lease()  # not refused for want of a place


def test_close_closes_the_idle_and_what_comes_back_and_fails_the_waiting() -> None:
    pool = Pool(Opened(), 2, 30.0, "test")
    idle, leased = pool.lease(), pool.lease()
    pool.give_back(idle)
    pool.close()
    assert closed(idle) and not closed(leased)
    pool.give_back(leased)
    assert closed(leased) and pool.open == 0
    with pytest.raises(TransportUnavailable, match="closed"):
        pool.lease()

    pool = Pool(Opened(), 1, 30.0, "test")
    pool.lease()
    got: list[object] = []
    thread = lease_in_thread(pool, got, "waiting")
    wait_for_waiters(pool, 1)
    started = time.monotonic()
    pool.close()
    thread.join(5)
    assert time.monotonic() - started < 2.0  # not the 30 s timeout
    ((_, error),) = cast(list[tuple[str, object]], got)
    assert isinstance(error, TransportUnavailable) and "closed" in str(error)


def test_a_tracked_connection_counts_a_transaction_from_its_first_cursor_to_its_end() -> None:
    """pyodbc has no transaction status; SQL Server's dialect keeps its own."""
    db = TrackedConnection(cast(DbConnection, sqlite3.connect(":memory:")))
    assert not db.in_transaction
    db.cursor().execute("CREATE TABLE t (x)")
    assert db.in_transaction
    db.commit()
    assert not db.in_transaction
    db.cursor().execute("INSERT INTO t VALUES (1)")
    db.rollback()
    assert not db.in_transaction
    assert db.total_changes == 1  # everything else is the wrapped connection's
    db.close()


def test_holding_leases_leave_the_last_connection_to_sends() -> None:
    """A source's lease holds its connection while the batch is sent elsewhere; sends end on
    their own. Were holding leases allowed every connection, two routes sending into each
    other's pools could each wait for the other until the timeout."""
    pool = Pool(Opened(), 3, 0.2, "test")
    pool.lease(holding=True)
    pool.lease(holding=True)
    assert not pool.free(holding=True) and pool.free(holding=False)
    with pytest.raises(TransportUnavailable):
        pool.lease(holding=True)
    send = pool.lease()  # the last one, at once
    pool.give_back(send)
    assert Pool(Opened(), 1, 0.2, "test").lease(holding=True)  # a pool of one: the one


def test_routes_into_each_others_pools_all_get_their_sends() -> None:
    """Two loops of A -> B and two of B -> A on pools of two: were every connection of a pool
    a held batch's, all four would wait for a send until the timeout."""
    a, b = Pool(Opened(), 2, 5.0, "a"), Pool(Opened(), 2, 5.0, "b")
    done: list[str] = []

    def loop(source: Pool, destination: Pool, name: str) -> None:
        batch = source.lease(holding=True)
        time.sleep(0.2)  # sending takes a while: every loop that got a batch holds it now
        send = destination.lease()
        destination.give_back(send)
        source.give_back(batch)
        done.append(name)

    threads = [
        threading.Thread(target=loop, args=(source, destination, f"{name}{i}"))
        for source, destination, name in ((a, b, "a->b"), (b, a, "b->a"))
        for i in range(2)
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(done) == ["a->b0", "a->b1", "b->a0", "b->a1"]
    assert time.monotonic() - started < 3.0  # not the 5 s timeout


def test_a_holding_lease_waiting_for_the_cap_is_served_when_a_holder_gives_back() -> None:
    pool = Pool(Opened(), 2, 5.0, "test")
    held = pool.lease(holding=True)
    got: list[object] = []
    thread = lease_in_thread_holding(pool, got)
    wait_for_waiters(pool, 1)
    send = pool.lease()  # the free one goes to a send; the holding waiter keeps waiting
    assert len(got) == 0
    pool.give_back(held)
    thread.join(5)
    ((_, db),) = cast(list[tuple[str, object]], got)
    assert db is held
    pool.give_back(send)


def lease_in_thread_holding(pool: Pool, got: list[object]) -> threading.Thread:
    thread = threading.Thread(target=lambda: got.append(("holding", pool.lease(holding=True))))
    thread.start()
    return thread
