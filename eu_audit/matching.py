"""The one target matcher: is the target (or a paraphrase of it) in a text, and where?

Receipts, audits, the sink policy, B6's redaction and span-only excision all ask this question; they ask
it here, so ``unlearn`` can never call a state clean that ``audit`` counts as a leak.

Matching ignores case, spacing, punctuation and digit grouping ('DE89 3704-0044' ~ 'de8937040044').
The matcher also knows the common paraphrases of identifiers: street abbreviations ('12 Linden St'),
an e-mail address or link spelled out with "at" / "dot" or without its scheme, an IBAN without its
country code and check digits. A target in comma-separated parts (an address: street, city, postcode) is
also found when a few joining words stand between its parts ('456 Oakwood Avenue, Rivermist, and 83214'):
every part, in order, and nothing between them but punctuation and words from ``JOINERS``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

_NON_ALNUM = re.compile(r"[^0-9a-z]+")
_SEP = r"[^0-9a-zA-Z]*"  # what may stand between two characters of a match: anything but letters/digits
_STREET = {
    "street": "st",
    "avenue": "ave",
    "road": "rd",
    "suite": "ste",
    "apartment": "apt",
    "drive": "dr",
    "boulevard": "blvd",
    "lane": "ln",
    "court": "ct",
    "place": "pl",
}
#: variants shorter than this (after normalising) would match by accident
MIN_CHARS = 3
#: the words a model puts between the parts of an address without saying anything else
JOINERS = ("and", "in", "at", "of", "the", "city", "zip", "postal", "postcode", "code", "with")
#: at most this many joining words between two parts: more is a sentence, not the address
MAX_JOINERS = 3


def normalise(text: str) -> str:
    """Lower-case and drop everything but letters and digits: 'DE89 3704-0044' -> 'de8937040044'."""
    return _NON_ALNUM.sub("", text.lower())


def paraphrases(value: str) -> list[str]:
    """Common rewritings of an identifier that a model produces without meaning anything new."""
    out: list[str] = []
    low = value.lower()
    for long, short in _STREET.items():
        if re.search(rf"\b{long}\b", low):
            out.append(re.sub(rf"\b{long}\b", short, low))
        if re.search(rf"\b{short}\b\.?", low):
            out.append(re.sub(rf"\b{short}\b\.?", long, low))
    if "@" in value:
        user, _, domain = value.partition("@")
        out.append(f"{user} at {domain.replace('.', ' dot ')}")
    if re.fullmatch(r"[A-Z]{2}\d{2}[\dA-Z ]{8,}", value.replace(" ", "")):
        out.append(value.replace(" ", "")[4:])  # the BBAN: the IBAN without country code and check digits
    if value.startswith(("http://", "https://")):
        out.append(value.split("://", 1)[1])
    return out


@dataclass(frozen=True)
class TargetMatcher:
    """The target z with the variants a forget request names and the paraphrases the matcher adds."""

    value: str
    given: tuple[str, ...] = field(default=())

    @classmethod
    def of(cls, value: str, variants: Iterable[str] = ()) -> TargetMatcher:
        return cls(value, tuple(variants))

    @cached_property
    def variants(self) -> list[str]:
        """Target, given variants and paraphrases, one per normalised form, long enough to mean it."""
        seen: dict[str, str] = {}
        for v in (self.value, *self.given, *(p for g in (self.value, *self.given) for p in paraphrases(g))):
            n = normalise(v)
            if len(n) >= MIN_CHARS:
                seen.setdefault(n, v)
        return list(seen.values())

    @cached_property
    def _needles(self) -> list[str]:
        return sorted({normalise(v) for v in self.variants}, key=len, reverse=True)

    @property
    def usable(self) -> bool:
        return bool(self._needles)

    @cached_property
    def _joined(self) -> list[str]:
        """Regexes for the variants in comma-separated parts, joining words allowed between the parts."""
        joiner = rf"(?:{_SEP}\b(?:{'|'.join(JOINERS)})\b){{0,{MAX_JOINERS}}}{_SEP}"
        out = []
        for v in self.variants:
            parts = [n for p in v.split(",") if (n := normalise(p))]  # variants are MIN_CHARS long
            if len(parts) > 1:
                out.append(joiner.join(_SEP.join(re.escape(c) for c in p) for p in parts))
        return out

    def found_in(self, text: str) -> bool:
        """Does ``text`` hold the target or a variant (up to case, spacing and punctuation, and joining
        words between the parts of a comma-separated target)?"""
        hay = normalise(text)
        return any(n in hay for n in self._needles) or (
            bool(self._joined) and bool(self.pattern.search(text))
        )

    @cached_property
    def pattern(self) -> re.Pattern[str]:
        """A regex over raw text that matches exactly where ``found_in`` finds a variant, so a redaction
        (B6) or an excision removes what the audits would count."""
        if not self._needles:
            return re.compile(r"(?!x)x")  # matches nothing
        # the joined forms first: at a place where both match, the longer span is the one to remove
        alts = [*self._joined, *(_SEP.join(re.escape(c) for c in n) for n in self._needles)]
        return re.compile("|".join(alts), re.IGNORECASE)

    def redact(self, text: str, replacement: str) -> str:
        return self.pattern.sub(replacement, text)

    def spans(self, text: str) -> list[tuple[int, int]]:
        return [m.span() for m in self.pattern.finditer(text)]


def contains_target(text: str, target: str, variants: Iterable[str] = ()) -> bool:
    """Shorthand for ``TargetMatcher.of(target, variants).found_in(text)``."""
    return TargetMatcher.of(target, variants).found_in(text)
