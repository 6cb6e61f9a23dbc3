"""The SQL Headers column codec: written as NServiceBus writes it, read as any JSON object."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.envelope import Headers
from bridge.errors import HeadersFormatError
from bridge.transports.sql.headers import decode, encode, read, write


class TestEncode:
    def test_compact_object(self) -> None:
        h = Headers([("NServiceBus.MessageId", "abc"), ("NServiceBus.MessageIntent", "Send")])
        assert encode(h) == '{"NServiceBus.MessageId":"abc","NServiceBus.MessageIntent":"Send"}'

    def test_slash_is_escaped(self) -> None:
        h = Headers([("NServiceBus.ContentType", "application/json"), ("a/b", "/")])
        assert encode(h) == r'{"NServiceBus.ContentType":"application\/json","a\/b":"\/"}'

    def test_non_ascii_is_written_raw(self) -> None:
        assert encode(Headers([("café", "日本 ü €")])) == '{"café":"日本 ü €"}'

    def test_no_headers_is_an_empty_object(self) -> None:
        assert encode(Headers()) == "{}"

    def test_null_and_empty_values_stay_apart(self) -> None:
        assert encode(Headers([("n", None), ("e", "")])) == '{"n":null,"e":""}'

    def test_order_is_kept(self) -> None:
        assert encode(Headers([("z", "1"), ("a", "2"), ("m", "3")])) == '{"z":"1","a":"2","m":"3"}'

    def test_control_characters_and_quotes_are_escaped(self) -> None:
        assert encode(Headers([("k", 'a"b\\c\n\t\x00')])) == r'{"k":"a\"b\\c\n\t\u0000"}'

    def test_duplicates_collapse_last_value_wins(self) -> None:
        h = Headers([("k", "1"), ("x", "x"), ("k", "2")])
        assert encode(h) == '{"k":"2","x":"x"}'

    @pytest.mark.parametrize("item", [("k", "a\ud800"), ("\udcff", "v"), ("k", "é\udfff")])
    def test_a_lone_surrogate_is_a_headers_error_not_a_driver_failure(
        self, item: tuple[str, str]
    ) -> None:
        with pytest.raises(HeadersFormatError, match="UTF-8"):
            encode(Headers([("NServiceBus.MessageId", "s"), item]))


class TestDecode:
    @pytest.mark.parametrize("column", [None, "", b"", "   ", "{}", b"{}"])
    def test_nothing_means_no_headers(self, column: str | bytes | None) -> None:
        assert decode(column) == Headers()

    def test_what_endpoints_write(self) -> None:
        column = r'{"NServiceBus.ContentType":"application\/json","café":"日本"}'
        assert decode(column) == Headers(
            [("NServiceBus.ContentType", "application/json"), ("café", "日本")]
        )

    def test_utf8_bytes(self) -> None:
        assert decode('{"k":"é"}'.encode()) == Headers([("k", "é")])

    def test_any_standard_json_escapes_and_whitespace(self) -> None:
        column = '\n { "caf\\u00e9" :\t"\\u00e9\\/\\n\\ud83d\\ude00" ,\r\n "b": "/" }\n'
        assert decode(column) == Headers([("café", "é/\n\U0001f600"), ("b", "/")])

    def test_order_is_kept(self) -> None:
        assert decode('{"z":"1","a":"2","m":"3"}').names() == ["z", "a", "m"]

    def test_nulls_are_kept_apart_from_empty_strings(self) -> None:
        h = decode('{"n":null,"e":""}')
        assert h.items() == [("n", None), ("e", "")]

    def test_repeated_names_are_kept(self) -> None:
        h = decode('{"k":"1","x":"x","k":"2"}')
        assert h.items() == [("k", "1"), ("x", "x"), ("k", "2")]
        assert h.get("k") == "2"


class TestPoison:
    @pytest.mark.parametrize(
        "column",
        [
            "[]",
            '[["k","v"]]',
            '[{"k":"v"}]',
            "[1]",
            '"text"',
            "42",
            "null",
            "true",
        ],
    )
    def test_non_object_json(self, column: str) -> None:
        with pytest.raises(HeadersFormatError, match="JSON object"):
            decode(column)

    @pytest.mark.parametrize(
        "column",
        [
            '{"k":1}',
            '{"k":1.5}',
            '{"k":true}',
            '{"k":["v"]}',
            '{"k":{"nested":"v"}}',
            '{"k":"ok","n":' + "1" * 5000 + "}",
        ],
    )
    def test_non_string_values(self, column: str) -> None:
        with pytest.raises(HeadersFormatError):
            decode(column)

    @pytest.mark.parametrize(
        "column",
        [
            "{",
            '{"k":"v"',
            "{'k':'v'}",
            '{"k":"v",}',
            '{"k":"v"} trailing',
            '{"k":NaN}',
            "not json",
            "[" * 100_000,
        ],
        ids=lambda column: column[:20],
    )
    def test_invalid_json(self, column: str) -> None:
        with pytest.raises(HeadersFormatError):
            decode(column)

    @pytest.mark.parametrize(
        "column",
        [
            '{"NServiceBus.MessageId":"s","k":"\\ud800"}',
            '{"NServiceBus.MessageId":"s","k":"x\\uDFFF"}',
            '{"\\udc80":"v"}',
            '{"k":"\\ude00\\ud83d"}',  # a pair in the wrong order is two lone halves
            b'{"k":"\\ud800"}',
        ],
    )
    def test_a_lone_surrogate_escape_is_poison(self, column: str | bytes) -> None:
        """Valid JSON, but no UTF-8 column, Kafka header or AMQP string can carry the text."""
        with pytest.raises(HeadersFormatError, match="lone surrogate"):
            decode(column)

    def test_an_escaped_surrogate_pair_is_one_character(self) -> None:
        assert decode('{"k":"\\ud83d\\ude00","\\\\ud800":"x"}') == Headers(
            [("k", "\U0001f600"), ("\\ud800", "x")]
        )

    @pytest.mark.parametrize("column", [b'{"k":"\xff"}', b"\xc3\x28", b'{"k":"\xed\xa0\x80"}'])
    def test_invalid_utf8_bytes(self, column: bytes) -> None:
        with pytest.raises(HeadersFormatError, match="UTF-8"):
            decode(column)


# Surrogates cannot be stored in a UTF-8 or UTF-16 column, so they are no header text.
header_text = st.text(st.characters(exclude_categories=["Cs"]))
unique_headers = st.lists(
    st.tuples(header_text, st.none() | header_text), unique_by=lambda item: item[0]
).map(Headers)


@given(unique_headers)
def test_decode_is_the_inverse_of_encode(headers: Headers) -> None:
    assert decode(encode(headers)) == headers


@given(unique_headers)
def test_encoded_text_has_no_raw_slash_and_reads_back_from_utf8(headers: Headers) -> None:
    text = encode(headers)
    assert "/" not in text.replace("\\/", "")
    assert decode(text.encode("utf-8")) == headers


@given(st.lists(st.tuples(st.sampled_from("abc"), st.none() | header_text)).map(Headers))
def test_duplicates_come_back_collapsed_as_to_dict_says(headers: Headers) -> None:
    assert decode(encode(headers)) == Headers(headers.to_dict().items())


def test_repeated_names_keep_every_occurrence_in_order() -> None:
    assert decode('{"a":"1","b":"x","a":"2"}') == Headers([("a", "1"), ("b", "x"), ("a", "2")])


class TestColumnText:
    """`read` keeps the column text and `write` gives it back while the headers are unchanged,
    so a row forwarded SQL to SQL keeps its Headers bytes (wire-format §5)."""

    @pytest.mark.parametrize(
        "column",
        [
            '\n { "caf\\u00e9" :\t"\\u00e9\\/\\n\\ud83d\\ude00" ,\r\n "b": "/" }\n',
            '{"NServiceBus.MessageId":"m","emoji":"\\uD83D\\uDE80","empty":""}',
            '{"NServiceBus.MessageId":"m","k":"1","k":"2"}',
            '{"NServiceBus.MessageId":"m","n":null,"raw":"é/🚀"}',
        ],
    )
    def test_unchanged_headers_write_the_text_they_were_read_from(self, column: str) -> None:
        headers = read(column)
        assert headers == decode(column)
        assert write(headers) == column
        assert write(read(column.encode("utf-8"))) == column

    @pytest.mark.parametrize(
        "change",
        [
            lambda h: h.set("k", "new"),
            lambda h: h.add("x", "y"),
            lambda h: h.remove("k"),
            lambda h: h.rename("k", "K"),
            lambda h: h.set("k", "2"),  # what it reads as, but one `k` fewer
        ],
    )
    def test_changed_headers_are_encoded_afresh(self, change: Callable[[Headers], None]) -> None:
        headers = read(' {"NServiceBus.MessageId":"m", "k":"1","k":"\\u0032"}')
        change(headers)
        assert write(headers) == encode(headers)

    def test_setting_a_header_to_what_it_holds_keeps_the_text(self) -> None:
        column = '{ "a" : "1" }'
        headers = read(column)
        headers.set("a", "1")
        assert write(headers) == column

    @pytest.mark.parametrize("column", [None, "", b"", "  "])
    def test_no_headers_are_written_as_an_empty_object(self, column: str | bytes | None) -> None:
        assert write(read(column)) == "{}"

    def test_a_copy_is_encoded_afresh(self) -> None:
        assert write(read('{ "a" : "1" }').copy()) == '{"a":"1"}'
