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
