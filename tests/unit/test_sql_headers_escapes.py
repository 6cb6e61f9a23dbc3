"""The table of characters NServiceBus escapes in the Headers column against the rule it was
derived by (`bridge.transports.sql.headers_escapes`), with this Python's Unicode tables.

The rule (dotnet/runtime src/libraries/System.Text.Encodings.Web/tools/GenDefinedCharList/
Program.cs, `IsAllowedUnicodeCategory` and `GetIsCodePointAllowedOverride`;
DefaultJavaScriptEncoder.cs `UnsafeRelaxedEscapingSingleton` forbids `"` and `\\` besides, and
escapes every character outside the BMP): a BMP character is written raw when its category is
a letter, mark, number, punctuation, symbol or Cf, or it is U+0020, and it is not U+FEFF.
"""

from __future__ import annotations

import unicodedata

from bridge.transports.sql.headers_escapes import BEYOND_JSON, ESCAPED

RAW_CATEGORIES = {
    *("Lu", "Ll", "Lt", "Lm", "Lo"),
    *("Mn", "Mc", "Me"),
    *("Nd", "Nl", "No"),
    *("Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po"),
    *("Sm", "Sc", "Sk", "So"),
    "Cf",
}

#: BMP code points assigned in Unicode 15.0 to 16.0: .NET 10's tables know them, the
#: `unicodedata` of Python 3.11 (Unicode 14.0) does not.
ASSIGNED_SINCE_UNICODE_14 = {
    0x0897, 0x0CF3, 0x0ECE, 0x1B4E, 0x1B4F, 0x1B7F, 0x1C89, 0x1C8A, 0x2427, 0x2428, 0x2429,
    0x2FFC, 0x2FFD, 0x2FFE, 0x2FFF, 0x31E4, 0x31E5, 0x31EF, 0xA7CB, 0xA7CC, 0xA7CD, 0xA7DA,
    0xA7DB, 0xA7DC,
}  # fmt: skip


def written_raw(code: int) -> bool:
    if code in (0x20, 0xFEFF) or chr(code) in '"\\/':
        return code == 0x20
    category = unicodedata.category(chr(code))
    if category == "Cn" and code in ASSIGNED_SINCE_UNICODE_14:
        return True  # this Python's tables are older than the runtime's
    return category in RAW_CATEGORIES


def test_every_bmp_character_is_escaped_by_the_rule() -> None:
    wrong = [
        f"U+{code:04X}"
        for code in range(0x10000)
        if (ESCAPED.fullmatch(chr(code)) is None) != written_raw(code)
    ]
    assert wrong == []


def test_every_character_outside_the_bmp_is_escaped() -> None:
    for code in (0x10000, 0x1F680, 0x20000, 0xE0001, 0xF0000, 0x10FFFF):
        assert ESCAPED.fullmatch(chr(code)) and BEYOND_JSON.fullmatch(chr(code))


def test_beyond_json_is_what_a_standard_json_writer_leaves_raw() -> None:
    """A standard writer escapes `"`, `\\` and U+0000..U+001F; `/` is handled on its own."""
    for code in range(0x10000):
        char = chr(code)
        standard = code < 0x20 or char in '"\\/'
        expected = ESCAPED.fullmatch(char) is not None and not standard
        assert (BEYOND_JSON.fullmatch(char) is not None) == expected, f"U+{code:04X}"
