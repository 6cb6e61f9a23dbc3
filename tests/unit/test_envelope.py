"""Headers is an ordered multimap (order, duplicates, None vs ""); Envelope knows its lifetime."""

from __future__ import annotations

import time

from bridge.envelope import MESSAGE_ID, Envelope, Headers


def headers(*items: tuple[str, str | None]) -> Headers:
    return Headers(items)


class TestHeadersMultimap:
    def test_keeps_insertion_order(self) -> None:
        h = headers(("b", "1"), ("a", "2"), ("c", "3"))
        assert h.names() == ["b", "a", "c"]
        assert list(h) == [("b", "1"), ("a", "2"), ("c", "3")]

    def test_keeps_duplicates_in_order(self) -> None:
        h = headers(("k", "1"), ("x", "x"), ("k", "2"))
        assert len(h) == 3
        assert h.get_all("k") == ["1", "2"]
        assert h.items() == [("k", "1"), ("x", "x"), ("k", "2")]

    def test_add_appends_even_when_the_name_exists(self) -> None:
        h = headers(("k", "1"))
        h.add("k", "2")
        assert h.items() == [("k", "1"), ("k", "2")]

    def test_adopt_takes_the_list_itself(self) -> None:
        items: list[tuple[str, str | None]] = [("k", "1")]
        h = Headers.adopt(items)
        h.add("x", None)
        assert items == [("k", "1"), ("x", None)]
        assert "x" in h and "k" in h and "y" not in h

    def test_get_sees_the_last_occurrence(self) -> None:
        h = headers(("k", "1"), ("k", "2"))
        assert h.get("k") == "2"

    def test_to_dict_last_value_wins_at_first_position(self) -> None:
        h = headers(("k", "1"), ("x", "x"), ("k", "2"))
        assert h.to_dict() == {"k": "2", "x": "x"}
        assert list(h.to_dict()) == ["k", "x"]

    def test_none_is_not_empty_string_and_not_missing(self) -> None:
        h = headers(("null", None), ("empty", ""))
        assert h.get("null", "default") is None
        assert h.get("empty", "default") == ""
        assert h.get("missing", "default") == "default"
        assert h.get("missing") is None
        assert "null" in h
        assert "missing" not in h
        assert headers(("k", None)) != headers(("k", ""))

    def test_a_later_none_wins_over_an_earlier_value(self) -> None:
        h = headers(("k", "1"), ("k", None))
        assert h.get("k", "default") is None
        assert h.to_dict() == {"k": None}

    def test_equality_is_order_and_duplicate_sensitive(self) -> None:
        assert headers(("a", "1"), ("b", "2")) == headers(("a", "1"), ("b", "2"))
        assert headers(("a", "1"), ("b", "2")) != headers(("b", "2"), ("a", "1"))
        assert headers(("a", "1")) != headers(("a", "1"), ("a", "1"))
        assert headers(("a", "1")) != {"a": "1"}

    def test_names_are_case_sensitive(self) -> None:
        h = headers(("Key", "1"))
        assert h.get("key") is None
        assert "key" not in h

    def test_copy_is_independent(self) -> None:
        original = headers(("a", "1"))
        copy = original.copy()
        copy.add("b", "2")
        copy.set("a", "changed")
        assert original == headers(("a", "1"))

    def test_items_is_a_snapshot(self) -> None:
        h = headers(("a", "1"))
        items = h.items()
        items.append(("b", "2"))
        assert h.items() == [("a", "1")]


class TestHeadersSet:
    def test_set_new_name_appends(self) -> None:
        h = headers(("a", "1"))
        h.set("b", "2")
        assert h.items() == [("a", "1"), ("b", "2")]

    def test_set_replaces_in_place(self) -> None:
        h = headers(("a", "1"), ("b", "2"), ("c", "3"))
        h.set("b", "new")
        assert h.items() == [("a", "1"), ("b", "new"), ("c", "3")]

    def test_set_collapses_duplicates_at_the_first_position(self) -> None:
        h = headers(("k", "1"), ("x", "x"), ("k", "2"))
        h.set("k", "3")
        assert h.items() == [("k", "3"), ("x", "x")]

    def test_set_none_keeps_the_name(self) -> None:
        h = headers(("k", "1"))
        h.set("k", None)
        assert h.items() == [("k", None)]


class TestHeadersRemove:
    def test_remove_drops_every_occurrence(self) -> None:
        h = headers(("k", "1"), ("x", "x"), ("k", "2"))
        h.remove("k")
        assert h.items() == [("x", "x")]

    def test_remove_missing_name_is_a_no_op(self) -> None:
        h = headers(("a", "1"))
        h.remove("missing")
        assert h.items() == [("a", "1")]


class TestHeadersRename:
    def test_rename_keeps_position_and_value(self) -> None:
        h = headers(("a", "1"), ("old", None), ("c", "3"))
        h.rename("old", "new")
        assert h.items() == [("a", "1"), ("new", None), ("c", "3")]

    def test_rename_every_occurrence(self) -> None:
        h = headers(("old", "1"), ("x", "x"), ("old", "2"))
        h.rename("old", "new")
        assert h.items() == [("new", "1"), ("x", "x"), ("new", "2")]

    def test_rename_onto_an_existing_name_loses_nothing(self) -> None:
        h = headers(("new", "kept"), ("old", "moved"))
        h.rename("old", "new")
        assert h.items() == [("new", "kept"), ("new", "moved")]
        assert h.get("new") == "moved"

    def test_rename_missing_name_is_a_no_op(self) -> None:
        h = headers(("a", "1"))
        h.rename("missing", "new")
        assert h.items() == [("a", "1")]


class TestEnvelopeLifetime:
    def test_message_id_comes_from_the_header(self) -> None:
        env = Envelope(headers=headers((MESSAGE_ID, "id-1")), body=b"")
        assert env.message_id == "id-1"
        assert Envelope(headers=Headers(), body=b"").message_id is None

    def test_without_expiry_never_expires(self) -> None:
        env = Envelope(headers=Headers(), body=b"")
        assert env.ttl_remaining(now=1e12) is None
        assert not env.is_expired(now=1e12)
        assert not env.is_expired()

    def test_ttl_remaining_counts_down_from_now(self) -> None:
        env = Envelope(headers=Headers(), body=b"", expires_at=1_000.0)
        assert env.ttl_remaining(now=990.0) == 10.0
        assert env.ttl_remaining(now=1_005.5) == -5.5

    def test_expired_at_and_after_the_deadline(self) -> None:
        env = Envelope(headers=Headers(), body=b"", expires_at=1_000.0)
        assert not env.is_expired(now=999.999)
        assert env.is_expired(now=1_000.0)
        assert env.is_expired(now=1_001.0)

    def test_default_now_is_the_wall_clock(self) -> None:
        future = Envelope(headers=Headers(), body=b"", expires_at=time.time() + 3_600)
        past = Envelope(headers=Headers(), body=b"", expires_at=time.time() - 1)
        remaining = future.ttl_remaining()
        assert remaining is not None
        assert 3_590 < remaining <= 3_600
        assert not future.is_expired()
        assert past.is_expired()
