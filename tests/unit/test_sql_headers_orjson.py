"""The seam `sql_headers_orjson`: the orjson codec and the standard library's (`encode_plain`,
`decode_plain`) give the same text, the same Headers and the same refusals, whichever of them
`bridge.speedups` picked for `encode` and `decode`."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bridge.envelope import Headers
from bridge.errors import HeadersFormatError
from bridge.transports.sql.headers import decode_fast, decode_plain, encode_fast, encode_plain

ENCODERS = pytest.mark.parametrize("encode", [encode_plain, encode_fast], ids=["plain", "fast"])
DECODERS = pytest.mark.parametrize("decode", [decode_plain, decode_fast], ids=["plain", "fast"])
Encode = Callable[[Headers], str]
Decode = Callable[[str | bytes | None], Headers]


# -- the NServiceBus writing and reading rules, pinned for both ------------------------------


@ENCODERS
@pytest.mark.parametrize(
    ("pairs", "text"),
    [
        (
            [("NServiceBus.ContentType", "application/json"), ("a/b", "/")],
            r'{"NServiceBus.ContentType":"application\/json","a\/b":"\/"}',
        ),
        ([("café", "日本 ü €")], '{"café":"日本 ü €"}'),
        ([], "{}"),
        ([("n", None), ("e", "")], '{"n":null,"e":""}'),
        ([("z", "1"), ("a", "2"), ("m", "3")], '{"z":"1","a":"2","m":"3"}'),
        ([("k", 'a"b\\c\n\t\x00')], r'{"k":"a\"b\\c\n\t\u0000"}'),
        ([("k", "1"), ("x", "x"), ("k", "2")], '{"k":"2","x":"x"}'),
    ],
)
def test_both_encoders_write_what_endpoints_write(
    encode: Encode, pairs: list[tuple[str, str | None]], text: str
) -> None:
    assert encode(Headers(pairs)) == text


# The approved serializations of NServiceBus's own tests (Particular/NServiceBus.SqlServer@214c4e8,
# src/NServiceBus.Transport.SqlServer.UnitTests/): the dictionaries of DictionarySerializerTests.cs
# and the text DictionarySerializer.Serialize writes for them, ApprovalFiles/
# DictionarySerializerTests.<test>.approved.txt (Can_round_trip's file opens with a UTF-8 byte
# order mark, the file's and not the text's: the others have none).
APPROVED = {
    "Can_round_trip": (  # DictionarySerializerTests.cs:12-20
        [("key1", "value1"), ("key2", "value2"), ("keyWithNull", None), ("keyWithEmpty", "")],
        '{"key1":"value1","key2":"value2","keyWithNull":null,"keyWithEmpty":""}',
    ),
    "Can_round_trip_empty_dictionary": ([], "{}"),  # :31-33
    "Can_round_trip_special_characters": (  # :44-66
        [
            (f"key{infix}{word}", f"value{infix}{word}")
            for infix, word in [
                (" with ", "spaces"),
                ("-with-", "dashes"),
                ("_with_", "underscores"),
                (".with.", "dots"),
                ("/with/", "slashes"),
                ("\\with\\", "backslashes"),
                ('"with"', "quotes"),
                ("'with'", "apostrophes"),
                (":with:", "colons"),
                (";with;", "semicolons"),
                (",with,", "commas"),
                ("=with=", "equals"),
                ("?with?", "question"),
                ("&with&", "ampersand"),
                ("<with>", "angle"),
                ("{with}", "braces"),
                ("[with]", "brackets"),
                ("(with)", "parens"),
            ]
        ],
        '{"key with spaces":"value with spaces","key-with-dashes":"value-with-dashes",'
        '"key_with_underscores":"value_with_underscores","key.with.dots":"value.with.dots",'
        '"key\\/with\\/slashes":"value\\/with\\/slashes",'
        '"key\\\\with\\\\backslashes":"value\\\\with\\\\backslashes",'
        '"key\\"with\\"quotes":"value\\"with\\"quotes",'
        "\"key'with'apostrophes\":\"value'with'apostrophes\","
        '"key:with:colons":"value:with:colons","key;with;semicolons":"value;with;semicolons",'
        '"key,with,commas":"value,with,commas","key=with=equals":"value=with=equals",'
        '"key?with?question":"value?with?question","key&with&ampersand":"value&with&ampersand",'
        '"key<with>angle":"value<with>angle","key{with}braces":"value{with}braces",'
        '"key[with]brackets":"value[with]brackets","key(with)parens":"value(with)parens"}',
    ),
    "Can_round_trip_unicode": (  # :79-87
        [
            ("ümlaut", "äöü"),
            ("emoji", "\U0001f680"),
            ("japanese", "こんにちは"),
            ("arabic", "مرحبا"),
            ("newline", "line1\r\nline2"),
            ("tab", "value\twith\ttabs"),
        ],
        '{"ümlaut":"äöü","emoji":"\\uD83D\\uDE80","japanese":"こんにちは","arabic":"مرحبا",'
        '"newline":"line1\\r\\nline2","tab":"value\\twith\\ttabs"}',
    ),
}


@ENCODERS
@pytest.mark.parametrize("test", sorted(APPROVED))
def test_both_encoders_write_the_approved_text_byte_for_byte(encode: Encode, test: str) -> None:
    pairs, approved = APPROVED[test]
    assert encode(Headers(pairs)).encode("utf-8") == approved.encode("utf-8")


@ENCODERS
@pytest.mark.parametrize(
    ("char", "written"),
    [
        # Two-character escapes (DefaultJavaScriptEncoder's EscaperImplementation map).
        ("\b\f", r"\b\f"),
        # Other controls: \uXXXX in upper-case hex, DEL and C1 included.
        ("\x00\x0b\x1a\x1f", r"\u0000\u000B\u001A\u001F"),
        ("\x7f\x85\x9f", r"\u007F\u0085\u009F"),
        # Space separators but U+0020, line and paragraph separators.
        ("\xa0 \u1680\u2000\u202f\u3000", r"\u00A0 \u1680\u2000\u202F\u3000"),
        ("\u2028\u2029", r"\u2028\u2029"),
        # Private use, unassigned (Unicode 16.0), noncharacters, the byte order mark.
        (
            "\ue000\uf8ff\u0378\ufdd0\ufffe\uffff\ufeff",
            r"\uE000\uF8FF\u0378\uFDD0\uFFFE\uFFFF\uFEFF",
        ),
        # Outside the BMP: the UTF-16 surrogate pair, whatever the character.
        (
            "\U00010000\U0001f600\U000e0001\U0010ffff",
            r"\uD800\uDC00\uD83D\uDE00\uDB40\uDC01\uDBFF\uDFFF",
        ),
        # Allowed, so raw: relaxed HTML characters, format characters, Unicode 16.0 letters.
        ("'<>&+`~", "'<>&+`~"),
        ("\xad\u200b\u200d\u2060", "\xad\u200b\u200d\u2060"),
        ("\u0897\u2fff\u31e4\ua7cb", "\u0897\u2fff\u31e4\ua7cb"),
        ("é€日本語", "é€日本語"),
    ],
)
def test_both_encoders_escape_what_system_text_json_relaxed_escapes(
    encode: Encode, char: str, written: str
) -> None:
    """See `bridge.transports.sql.headers_escapes` for the encoder's rules these pin."""
    assert encode(Headers([(char, char)])) == f'{{"{written}":"{written}"}}'


@ENCODERS
@pytest.mark.parametrize("item", [("k", "a\ud800"), ("\udcff", "v"), ("k", "é\udfff")])
def test_both_encoders_refuse_a_lone_surrogate(encode: Encode, item: tuple[str, str]) -> None:
    with pytest.raises(HeadersFormatError, match="UTF-8"):
        encode(Headers([("NServiceBus.MessageId", "s"), item]))


@DECODERS
@pytest.mark.parametrize(
    ("column", "pairs"),
    [
        (None, []),
        (b"", []),
        ("  ", []),
        (
            r'{"NServiceBus.ContentType":"application\/json","café":"日本"}',
            [("NServiceBus.ContentType", "application/json"), ("café", "日本")],
        ),
        ('{"k":"é"}'.encode(), [("k", "é")]),
        ('{"n":null,"e":""}', [("n", None), ("e", "")]),
        ('{"k":"1","x":"x","k":"2"}', [("k", "1"), ("x", "x"), ("k", "2")]),
        ('{"k":"\\ud83d\\ude00"}', [("k", "\U0001f600")]),
    ],
)
def test_both_decoders_read_what_endpoints_write(
    decode: Decode, column: str | bytes | None, pairs: list[tuple[str, str | None]]
) -> None:
    assert decode(column) == Headers(pairs)


@DECODERS
@pytest.mark.parametrize("column", ['{"k":"\\ud800"}', "[]", '{"k":1}', b"\xff{}", "{"])
def test_both_decoders_refuse_what_no_header_can_be(decode: Decode, column: str | bytes) -> None:
    with pytest.raises(HeadersFormatError):
        decode(column)


# -- fast and plain agree on any input ------------------------------------------------------

any_text = st.text()  # surrogates included: both paths must refuse them alike


def _outcome(function: Callable[[], object]) -> object:
    try:
        return function()
    except HeadersFormatError:
        return HeadersFormatError


@settings(max_examples=300)
@given(st.lists(st.tuples(any_text, st.none() | any_text)).map(Headers))
def test_encode_writes_what_the_standard_encoder_writes(headers: Headers) -> None:
    assert _outcome(lambda: encode_fast(headers)) == _outcome(lambda: encode_plain(headers))


def _object_text(pairs: list[tuple[str, object]], spaced: bool) -> str:
    """A JSON object with these pairs in this order, repeated names kept (json.dumps of a dict
    cannot write one)."""
    sep = ", " if spaced else ","
    colon = ": " if spaced else ":"
    return "{" + sep.join(json.dumps(k) + colon + json.dumps(v) for k, v in pairs) + "}"


json_values = (
    st.none()
    | st.text()
    | st.integers()
    | st.booleans()
    | st.floats()
    | st.lists(st.text(), max_size=2)
)
names_with_repeats = st.sampled_from(["a", "b", 'q"', "\\", "/"]) | st.text(max_size=8)


@settings(max_examples=500)
@given(st.lists(st.tuples(names_with_repeats, json_values), max_size=8), st.booleans())
def test_decode_reads_what_the_standard_decoder_reads(
    pairs: list[tuple[str, object]], spaced: bool
) -> None:
    """Repeated names, escaped quotes and backslashes, numbers, nested values, surrogates,
    NaN: whatever the text, the result (headers or HeadersFormatError) is the standard one."""
    text = _object_text(pairs, spaced)
    assert _outcome(lambda: decode_fast(text)) == _outcome(lambda: decode_plain(text))


@given(st.text(max_size=40))
def test_decode_of_any_text_is_the_standard_outcome(text: str) -> None:
    assume(text and not text.isspace())  # no headers, before either decoder
    assert _outcome(lambda: decode_fast(text)) == _outcome(lambda: decode_plain(text))


#: What NServiceBus escapes beyond standard JSON, and the characters around those rules.
escape_heavy = st.text(
    st.sampled_from(
        [
            *'"\\/\b\f\n\r\t\x00\x0b\x1f \x7f\x85\xa0\xad\u2028\u3000\ue000\ufeff\uffff',
            *("\U0001f680", "\U0010ffff", "\u0897", "é", "a", "<", "'"),
        ]
    )
    | st.characters(exclude_categories=["Cs"])
)


@settings(max_examples=500)
@given(st.lists(st.tuples(escape_heavy, st.none() | escape_heavy), max_size=6).map(Headers))
def test_both_encoders_agree_on_every_escape_and_read_back(headers: Headers) -> None:
    text = encode_plain(headers)
    assert encode_fast(headers) == text
    assert decode_plain(text) == decode_fast(text) == Headers(headers.to_dict().items())


@pytest.mark.parametrize(
    "text",
    [
        '{"a":"1","a":"2"}',
        '{"a":"1","b":null,"a":null}',
        '{"a":null,"a":null}',
        '{"k":"say \\"hi\\"","k":"x"}',
        '{"k\\"":"1"}',
        '{"k":"ends in \\\\"}',
        '{"k":"\\u0022"}',
        '{"k":"x"} ',
        '[["k","v"]]',
        '{"k":NaN}',
        '{"k":"\\ud800"}',
        '\ufeff{"k":"v"}',
        '{"k":"v",}',
        '{"k":"raw\ncontrol"}',
    ],
)
def test_decode_edge_cases_read_as_the_standard_decoder_reads_them(text: str) -> None:
    assert _outcome(lambda: decode_fast(text)) == _outcome(lambda: decode_plain(text))


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "/", '"', "é"]) | any_text, st.none() | any_text)
    ).map(Headers)
)
def test_fast_and_plain_round_trips_agree(headers: Headers) -> None:
    """Header lists with duplicates, nulls, escapes and unicode: the same text, and read back,
    the same Headers (or the same refusal)."""
    text = _outcome(lambda: encode_fast(headers))
    assert text == _outcome(lambda: encode_plain(headers))
    if isinstance(text, str):
        assert decode_fast(text) == decode_plain(text) == Headers(headers.to_dict().items())
        raw = text.encode("utf-8")
        assert decode_fast(raw) == decode_plain(raw)
