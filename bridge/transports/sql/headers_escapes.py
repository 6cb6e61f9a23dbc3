"""The characters NServiceBus writes as escapes in the Headers column (wire-format §5).

NServiceBus serializes the headers with System.Text.Json and the encoder
`JavaScriptEncoder.UnsafeRelaxedJsonEscaping`, then writes every `/` as `\\/`
(Particular/NServiceBus.SqlServer@214c4e8,
src/NServiceBus.Transport.Sql.Shared/Queuing/DictionarySerializer.cs:13-14, 19-45). What that
encoder does (dotnet/runtime, src/libraries/System.Text.Encodings.Web: DefaultJavaScriptEncoder.cs
`UnsafeRelaxedEscapingSingleton` and its `EscaperImplementation`, OptimizedInboxTextEncoder.cs,
tools/GenDefinedCharList/Program.cs):

- `"`, `\\` and the controls U+0008, U+0009, U+000A, U+000C, U+000D become two-character
  escapes (`\\"`, `\\\\`, `\\b`, `\\t`, `\\n`, `\\f`, `\\r`);
- any other character it does not allow becomes `\\uXXXX` in upper-case hex, and a character
  outside the BMP (which it never allows) its UTF-16 surrogate pair, `\\uD83D\\uDE80`;
- it allows U+0020 and every BMP character whose Unicode category is a letter, mark, number,
  punctuation, symbol or format (Cf) character, but U+FEFF. So `'<>&+` and `` ` `` stay raw,
  and the other space separators (U+00A0, U+3000, ...), U+2028, U+2029, the controls (DEL and
  C1 too), surrogates, private-use and unassigned code points are escaped.

"Unassigned" is by the Unicode version of the runtime: `_ESCAPED_BMP` lists the BMP code points
escaped under Unicode 16.0, the tables of .NET 10, which the transport targets. It was derived
from UnicodeData 16.0 by the rule above and checked against .NET's own bitmap
(UnicodeHelpers.generated.cs); `tests/unit/test_sql_headers_escapes.py` checks it against the
rule with this Python's `unicodedata`.
"""

from __future__ import annotations

import re

from bridge.errors import HeadersFormatError

__all__ = ["BEYOND_JSON", "ESCAPED", "quoted"]

#: The BMP code points System.Text.Encodings.Web does not allow (Unicode 16.0), as hex ranges.
_ESCAPED_BMP = (
    "0000-001F 007F-00A0 0378-0379 0380-0383 038B 038D 03A2 0530 0557-0558 058B-058C 0590 "
    "05C8-05CF 05EB-05EE 05F5-05FF 070E 074B-074C 07B2-07BF 07FB-07FC 082E-082F 083F "
    "085C-085D 085F 086B-086F 088F 0892-0896 0984 098D-098E 0991-0992 09A9 09B1 09B3-09B5 "
    "09BA-09BB 09C5-09C6 09C9-09CA 09CF-09D6 09D8-09DB 09DE 09E4-09E5 09FF-0A00 0A04 "
    "0A0B-0A0E 0A11-0A12 0A29 0A31 0A34 0A37 0A3A-0A3B 0A3D 0A43-0A46 0A49-0A4A 0A4E-0A50 "
    "0A52-0A58 0A5D 0A5F-0A65 0A77-0A80 0A84 0A8E 0A92 0AA9 0AB1 0AB4 0ABA-0ABB 0AC6 0ACA "
    "0ACE-0ACF 0AD1-0ADF 0AE4-0AE5 0AF2-0AF8 0B00 0B04 0B0D-0B0E 0B11-0B12 0B29 0B31 0B34 "
    "0B3A-0B3B 0B45-0B46 0B49-0B4A 0B4E-0B54 0B58-0B5B 0B5E 0B64-0B65 0B78-0B81 0B84 "
    "0B8B-0B8D 0B91 0B96-0B98 0B9B 0B9D 0BA0-0BA2 0BA5-0BA7 0BAB-0BAD 0BBA-0BBD 0BC3-0BC5 "
    "0BC9 0BCE-0BCF 0BD1-0BD6 0BD8-0BE5 0BFB-0BFF 0C0D 0C11 0C29 0C3A-0C3B 0C45 0C49 "
    "0C4E-0C54 0C57 0C5B-0C5C 0C5E-0C5F 0C64-0C65 0C70-0C76 0C8D 0C91 0CA9 0CB4 0CBA-0CBB "
    "0CC5 0CC9 0CCE-0CD4 0CD7-0CDC 0CDF 0CE4-0CE5 0CF0 0CF4-0CFF 0D0D 0D11 0D45 0D49 "
    "0D50-0D53 0D64-0D65 0D80 0D84 0D97-0D99 0DB2 0DBC 0DBE-0DBF 0DC7-0DC9 0DCB-0DCE 0DD5 "
    "0DD7 0DE0-0DE5 0DF0-0DF1 0DF5-0E00 0E3B-0E3E 0E5C-0E80 0E83 0E85 0E8B 0EA4 0EA6 "
    "0EBE-0EBF 0EC5 0EC7 0ECF 0EDA-0EDB 0EE0-0EFF 0F48 0F6D-0F70 0F98 0FBD 0FCD 0FDB-0FFF "
    "10C6 10C8-10CC 10CE-10CF 1249 124E-124F 1257 1259 125E-125F 1289 128E-128F 12B1 "
    "12B6-12B7 12BF 12C1 12C6-12C7 12D7 1311 1316-1317 135B-135C 137D-137F 139A-139F "
    "13F6-13F7 13FE-13FF 1680 169D-169F 16F9-16FF 1716-171E 1737-173F 1754-175F 176D 1771 "
    "1774-177F 17DE-17DF 17EA-17EF 17FA-17FF 181A-181F 1879-187F 18AB-18AF 18F6-18FF 191F "
    "192C-192F 193C-193F 1941-1943 196E-196F 1975-197F 19AC-19AF 19CA-19CF 19DB-19DD "
    "1A1C-1A1D 1A5F 1A7D-1A7E 1A8A-1A8F 1A9A-1A9F 1AAE-1AAF 1ACF-1AFF 1B4D 1BF4-1BFB "
    "1C38-1C3A 1C4A-1C4C 1C8B-1C8F 1CBB-1CBC 1CC8-1CCF 1CFB-1CFF 1F16-1F17 1F1E-1F1F "
    "1F46-1F47 1F4E-1F4F 1F58 1F5A 1F5C 1F5E 1F7E-1F7F 1FB5 1FC5 1FD4-1FD5 1FDC 1FF0-1FF1 "
    "1FF5 1FFF-200A 2028-2029 202F 205F 2065 2072-2073 208F 209D-209F 20C1-20CF 20F1-20FF "
    "218C-218F 242A-243F 244B-245F 2B74-2B75 2B96 2CF4-2CF8 2D26 2D28-2D2C 2D2E-2D2F "
    "2D68-2D6E 2D71-2D7E 2D97-2D9F 2DA7 2DAF 2DB7 2DBF 2DC7 2DCF 2DD7 2DDF 2E5E-2E7F 2E9A "
    "2EF4-2EFF 2FD6-2FEF 3000 3040 3097-3098 3100-3104 3130 318F 31E6-31EE 321F A48D-A48F "
    "A4C7-A4CF A62C-A63F A6F8-A6FF A7CE-A7CF A7D2 A7D4 A7DD-A7F1 A82D-A82F A83A-A83F "
    "A878-A87F A8C6-A8CD A8DA-A8DF A954-A95E A97D-A97F A9CE A9DA-A9DD A9FF AA37-AA3F "
    "AA4E-AA4F AA5A-AA5B AAC3-AADA AAF7-AB00 AB07-AB08 AB0F-AB10 AB17-AB1F AB27 AB2F "
    "AB6C-AB6F ABEE-ABEF ABFA-ABFF D7A4-D7AF D7C7-D7CA D7FC-F8FF FA6E-FA6F FADA-FAFF "
    "FB07-FB12 FB18-FB1C FB37 FB3D FB3F FB42 FB45 FBC3-FBD2 FD90-FD91 FDC8-FDCE FDD0-FDEF "
    "FE1A-FE1F FE53 FE67 FE6C-FE6F FE75 FEFD-FF00 FFBF-FFC1 FFC8-FFC9 FFD0-FFD1 FFD8-FFD9 "
    "FFDD-FFDF FFE7 FFEF-FFF8 FFFE-FFFF "
)


def _ranges(table: str) -> list[tuple[int, int]]:
    found = []
    for item in table.split():
        low, _, high = item.partition("-")
        found.append((int(low, 16), int(high or low, 16)))
    return found


def _char_class(ranges: list[tuple[int, int]], extra: str = "") -> re.Pattern[str]:
    body = "".join(f"\\u{low:04x}-\\u{high:04x}" for low, high in ranges)
    return re.compile(f"[{body}{extra}\\U00010000-\\U0010ffff]")


_BMP = _ranges(_ESCAPED_BMP)

#: Every character NServiceBus writes as an escape: the table, `"`, `\\`, `/` and all outside
#: the BMP.
ESCAPED = _char_class(_BMP, extra='"\\\\/')

#: The characters NServiceBus escapes that a standard JSON writer leaves raw (it escapes only
#: `"`, `\\` and U+0000..U+001F); `/` aside.
BEYOND_JSON = _char_class([(max(low, 0x20), high) for low, high in _BMP if high >= 0x20])

_SHORT = {
    '"': '\\"',
    "\\": "\\\\",
    "/": "\\/",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    short = _SHORT.get(char)
    if short is not None:
        return short
    code = ord(char)
    if code <= 0xFFFF:
        if 0xD800 <= code <= 0xDFFF:
            raise HeadersFormatError(
                f"a header is not encodable as UTF-8: it holds the surrogate U+{code:04X}"
            )
        return f"\\u{code:04X}"
    code -= 0x10000
    return f"\\u{0xD800 | code >> 10:04X}\\u{0xDC00 | code & 0x3FF:04X}"


def quoted(text: str) -> str:
    """`text` as the JSON string NServiceBus writes for it, quotes included; HeadersFormatError
    when it holds a surrogate (no UTF-8 column can hold the header)."""
    return '"' + ESCAPED.sub(_escape, text) + '"'
