"""Folding a text to what it says, keeping where each folded character came from.

A model writes the same target many ways: upper case, accents dropped ("Jose Garcia" for "José García"),
"ß" as "SS", full-width digits, zero-width characters inside a word, HTML entities ("&amp;", "&#233;"),
JSON escapes ("\\u00e9"), URL-encoding ("12%20Linden%20St"), any punctuation or spacing between the
characters. ``fold`` turns a text into its words of letters and digits (every script's, not only a-z),
lower-cased and accent-free, one space between words, and remembers for each folded character the span
of the raw text it came from, so a match in the folded text is a span of the raw text that a redaction
or a mask can replace.
"""

from __future__ import annotations

import html
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

#: an HTML character reference, a run of URL percent-escapes (encoded again any number of times: "%2520"),
#: of JSON ``\uXXXX`` or of Python ``\xNN`` escapes: decoded as one unit of the raw text
_UNIT = re.compile(
    r"&(?:#\d{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});"
    r"|(?:%(?:25)*[0-9A-Fa-f]{2})+|(?:\\u[0-9a-fA-F]{4})+|(?:\\x[0-9a-fA-F]{2})+"
)
_PERCENT_AGAIN = re.compile(r"%25(?=(?:25)*[0-9A-Fa-f]{2})")
_ASCII_WORD = re.compile(r"[0-9A-Za-z]+")
#: letters that Unicode does not decompose into a base letter and a mark, folded as a reader would
_LETTERS = {"ø": "o", "æ": "ae", "œ": "oe", "đ": "d", "ð": "d", "ł": "l", "þ": "th", "ı": "i", "ŧ": "t"}


@dataclass(frozen=True)
class Folded:
    """A folded text: ``text`` holds words of folded letters and digits separated by one space; the
    raw span of ``text[i]`` is ``raw[starts[i]:ends[i]]`` (a space's span is its left neighbour's end)."""

    text: str
    starts: tuple[int, ...]
    ends: tuple[int, ...]

    def raw_span(self, a: int, b: int) -> tuple[int, int]:
        """The raw span of the folded characters ``text[a:b]`` (b > a)."""
        return self.starts[a], self.ends[b - 1]

    @property
    def squashed(self) -> str:
        return self.text.replace(" ", "")


@lru_cache(maxsize=4096)
def fold_char(c: str) -> str:
    """One character folded: compatibility-decomposed, marks dropped, case-folded; what is left of it
    that is a letter or digit (empty for punctuation, spaces, zero-width and control characters)."""
    out: list[str] = []
    for d in unicodedata.normalize("NFKD", c):
        if unicodedata.combining(d):
            continue
        if not d.isascii() and unicodedata.category(d) == "Nd":  # Arabic-Indic, Devanagari ... digits
            out.append(str(unicodedata.digit(d)))
            continue
        for f in d.casefold():
            f = _LETTERS.get(f, f)
            out.extend(ch for ch in f if ch.isalnum())
    return "".join(out)


def _units(raw: str) -> list[tuple[str, int, int]]:
    """(decoded text, raw start, raw end) units: an entity or a run of escapes decodes as one."""
    out: list[tuple[str, int, int]] = []
    pos = 0
    for m in _UNIT.finditer(raw):
        out.extend((raw[i], i, i + 1) for i in range(pos, m.start()))
        s = m.group()
        if s.startswith("&"):
            decoded = html.unescape(s)
        elif s.startswith("\\x"):  # Python's \xNN escapes: a bytes repr (UTF-8), else Latin-1 as str's repr
            raw_bytes = bytes.fromhex(s.replace("\\x", ""))
            try:
                decoded = raw_bytes.decode("utf-8")
            except UnicodeDecodeError:
                decoded = raw_bytes.decode("latin-1")
        elif s.startswith("\\"):  # JSON's \uXXXX escapes (a tool call's arguments as a model API sends them)
            decoded = (
                s.encode("ascii")
                .decode("unicode_escape", errors="replace")
                .encode("utf-16", "surrogatepass")
                .decode("utf-16", errors="replace")
            )
        else:
            once = s
            while _PERCENT_AGAIN.search(once):  # "%2520" was "%20" encoded again
                once = _PERCENT_AGAIN.sub("%", once)
            try:
                decoded = bytes.fromhex(once.replace("%", "")).decode("utf-8")
            except UnicodeDecodeError:
                decoded = s
        if decoded == s:  # not a reference after all: its characters stand for themselves
            out.extend((raw[i], i, i + 1) for i in range(m.start(), m.end()))
        else:
            out.append((decoded, m.start(), m.end()))
        pos = m.end()
    out.extend((raw[i], i, i + 1) for i in range(pos, len(raw)))
    return out


def _plain(raw: str) -> bool:
    """Plain ASCII with nothing to decode: folded at C speed."""
    return raw.isascii() and "&" not in raw and "%" not in raw and "\\u" not in raw and "\\x" not in raw


def _fold_ascii(raw: str) -> Folded:
    """The same folding for plain ASCII with no entity or escape, at C speed: words of [0-9a-z]."""
    words: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    for m in _ASCII_WORD.finditer(raw):
        if words:
            starts.append(m.start())
            ends.append(m.start())
        words.append(m.group().lower())
        starts.extend(range(m.start(), m.end()))
        ends.extend(range(m.start() + 1, m.end() + 1))
    return Folded(" ".join(words), tuple(starts), tuple(ends))


def fold(raw: str) -> Folded:
    """``raw`` folded (the module's docstring says how), with each folded character's raw span."""
    if _plain(raw):
        return _fold_ascii(raw)
    chars: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    gap = False
    for text, a, b in _units(raw):
        for c in text:
            f = fold_char(c)
            if not f:
                gap = True
                continue
            if gap and chars:
                chars.append(" ")
                starts.append(a)
                ends.append(a)
            gap = False
            for ch in f:
                chars.append(ch)
                starts.append(a)
                ends.append(b)
    return Folded("".join(chars), tuple(starts), tuple(ends))


def fold_text(raw: str) -> str:
    """``fold(raw).text`` without the spans: what a yes/no question needs, at C speed for plain ASCII."""
    if _plain(raw):
        return " ".join(_ASCII_WORD.findall(raw)).lower()
    return fold(raw).text


def normalise(text: str) -> str:
    """A text's letters and digits alone, folded: 'DE89 3704-0044' -> 'de8937040044', 'José' -> 'jose'."""
    return fold_text(text).replace(" ", "")
