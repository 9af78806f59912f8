"""z in the forms an agent can send it: views of a text a model could decode back to z.

The matcher folds what a model *writes* (case, accents, entities, escapes, spelled numbers: ``fold``).
An agent that wants z past the residue reader can send it *encoded*: base64, hex, percent-encoded more
than once, as ``\\x``/``\\u`` escapes, in look-alike letters of another script, or reversed. Each decoder
here turns a text into the view a model would read, and the residue reader looks for z in each view where
the text itself does not show it (``found_encoded``). A decoder never claims z on its own: the matcher
decides on the decoded view, so a false alarm needs clean text whose decoding happens to spell the
target. ``eu-audit matcher`` measures that rate on the labelled set's texts without z.
"""

from __future__ import annotations

import base64
import binascii
import html
import re
import urllib.parse
from collections.abc import Callable

#: a run of base64 (standard or URL-safe) long enough to carry a word
_B64 = re.compile(r"[A-Za-z0-9+/_-]{12,}={0,2}")
#: hex: a run of byte pairs, joined or separated by spaces, colons or ``\x``
_HEX = re.compile(r"(?:(?:\\x|0x)?[0-9A-Fa-f]{2}[\s:,-]?){6,}")
_ESCAPE = re.compile(r"\\(x[0-9A-Fa-f]{2}|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8})")

#: look-alike letters of Cyrillic, Greek and Armenian for Latin ones (the confusables a keyboard types;
#: in the spirit of Unicode's UTS #39 skeleton, for the letters a target's Latin text is made of)
CONFUSABLES = str.maketrans(
    {
        "а": "a", "в": "b", "е": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p", "с": "c", "т": "t",
        "у": "y", "х": "x", "ѕ": "s", "і": "i", "ј": "j", "ԁ": "d", "ԛ": "q", "ԝ": "w", "һ": "h", "ɡ": "g",
        "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P", "С": "C", "Т": "T",
        "Х": "X", "Ѕ": "S", "І": "I", "Ј": "J", "Ү": "Y", "Ԁ": "D", "Ԍ": "G",
        "α": "a", "ο": "o", "ρ": "p", "ν": "v", "τ": "t", "ι": "i", "κ": "k", "υ": "u", "χ": "x",
        "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N", "Ο": "O",
        "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X", "օ": "o", "ս": "u", "ց": "g", "հ": "h", "ո": "n",
    }
)  # fmt: skip


def _text(raw: bytes) -> str | None:
    """Bytes as text when they are mostly printable UTF-8 (a decoding that yields noise is no view)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    printable = sum(c.isprintable() or c.isspace() for c in text)
    return text if text and printable >= 0.9 * len(text) else None


def _b64(text: str) -> list[str]:
    out = []
    for run in _B64.findall(text):
        body = run.rstrip("=")
        for alt in (None, b"-_"):
            try:
                raw = base64.b64decode(body + "=" * (-len(body) % 4), altchars=alt, validate=True)
            except (binascii.Error, ValueError):
                continue
            if (t := _text(raw)) is not None:
                out.append(t)
                break
    return out


def _hex(text: str) -> list[str]:
    out = []
    for run in _HEX.findall(text):
        digits = re.sub(r"\\x|0x|[\s:,-]", "", run)
        if len(digits) % 2:
            digits = digits[:-1]
        try:
            raw = bytes.fromhex(digits)
        except ValueError:
            continue
        if (t := _text(raw)) is not None:
            out.append(t)
    return out


def _percent(text: str) -> list[str]:
    """Percent-decoded until it stops changing (double and triple encoding included)."""
    if "%" not in text:
        return []
    seen, now = text, urllib.parse.unquote(text)
    for _ in range(4):
        if now == seen:
            break
        seen, now = now, urllib.parse.unquote(now)
    return [now] if now != text else []


def _escapes(text: str) -> list[str]:
    r"""``\xNN``, ``\uNNNN`` and ``\UNNNNNNNN`` escapes as the characters they name."""
    if "\\" not in text:
        return []

    def char(m: re.Match[str]) -> str:
        try:
            return chr(int(m.group(1)[1:], 16))
        except ValueError:
            return m.group(0)

    now = _ESCAPE.sub(char, text)
    return [now] if now != text else []


def _entities(text: str) -> list[str]:
    if "&" not in text:
        return []
    now = html.unescape(html.unescape(text))
    return [now] if now != text else []


def _confusables(text: str) -> list[str]:
    now = text.translate(CONFUSABLES)
    return [now] if now != text else []


def _reversed(text: str) -> list[str]:
    return [text[::-1]]


#: each decoder's name (what a finding says) and its views of a text
DECODERS: dict[str, Callable[[str], list[str]]] = {
    "base64": _b64,
    "hex": _hex,
    "percent-encoding": _percent,
    "escapes": _escapes,
    "HTML entities": _entities,
    "look-alike letters": _confusables,
    "reversed": _reversed,
}


def decoded_views(text: str) -> list[tuple[str, str]]:
    """(decoder, view) for every decoding of ``text`` some decoder makes."""
    return [(name, view) for name, decode in DECODERS.items() for view in decode(text)]


def found_encoded(found_in: Callable[[str], bool], text: str) -> str:
    """The decoder whose view of ``text`` shows z (``found_in``, a matcher's), "" when none does; for a
    text that does not show z itself."""
    return next((name for name, view in decoded_views(text) if found_in(view)), "")
