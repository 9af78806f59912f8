"""The one target matcher: is the target (or a plausible rewriting of it) in a text, and where?

Receipts, audits, the sink policy, B6's redaction, span-only excision and the masking of everything meant
to leave the machine all ask this question; they ask it here, so ``unlearn`` can never call a state clean
that ``audit`` counts as a leak, and a mask never leaves in clear what an audit counted.

What counts as the target (the rule the labelled set in ``eu_audit/matching/labelled.jsonl`` is marked
by, and ``eu-audit matcher`` measures):

- the target or a variant the forget request names, up to what ``fold`` ignores: case (Unicode
  case-folding, "ß" ~ "SS"), accents ("José" ~ "Jose"), compatibility forms (full-width digits,
  ligatures), digits of any script as their values ("٨٣٢١٤" ~ "83214"), HTML entities, URL-encoding
  (repeated too), JSON and Python backslash escapes, punctuation, spacing, digit grouping and
  zero-width characters ('DE89 3704-0044' ~ 'de8937040044'), in any script;
- numbers spelled out ("twelve Linden Street", "eight three two one four"), where the target has digits,
  and digits for a target's number words ("for 3 weeks" for "for three weeks");
- the common paraphrases of identifiers: street abbreviations ('12 Linden St'), an e-mail address spelled
  with "at" / "dot", a link without its scheme, an IBAN without its country code and check digits;
- a target that opens with an article ("a severe penicillin allergy") without it, when what is left is
  at least ``ARTICLE_MIN_WORDS`` words and ``ARTICLE_MIN_CHARS`` letters ("the shop" never becomes "shop");
- a number's leading zeros dropped ("4204 Jennifer Club" for "04204 Jennifer Club");
- a Cyrillic or Greek target in Latin letters, by the common schemes ("ulitsa Lenina 7", "Dmitry
  Smirnov", "Eleni Papadopoulou": ``matching.translit``);
- a target cut off where the text ends (an answer stopped at its token limit): a prefix of a variant of
  at least ``CUT_MIN_CHARS`` folded characters and ``CUT_MIN_SHARE`` of it, holding at least half of its
  digits ("... is DE27 9498 1080 2423 80" for an IBAN of 22; never "13 Linden Street" for the variant
  "Linden Street 12");
- a target in comma-separated parts (an address: street, city, postcode) with up to ``MAX_JOINERS`` of the
  ``JOINERS`` between its parts ('456 Oakwood Avenue, which is in Rivermist, 83214'): every part, in order.

Anything shorter than ``MIN_CHARS`` folded characters is never a needle (it would match by accident).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

from eu_audit.matching.fold import Folded, fold, fold_text, normalise
from eu_audit.matching.numbers import NUMBER_WORDS, spell_digits
from eu_audit.matching.translit import transliterations

__all__ = ["JOINERS", "MIN_CHARS", "TargetMatcher", "contains_target", "fold", "normalise", "paraphrases"]

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
#: variants shorter than this (folded letters and digits) would match by accident
MIN_CHARS = 3
#: the words a model puts between the parts of an address without saying anything else
JOINERS = (
    "and",
    "in",
    "at",
    "of",
    "the",
    "city",
    "zip",
    "postal",
    "postcode",
    "code",
    "with",
    "which",
    "is",
    "located",
)
#: at most this many joining words between two parts: more is a sentence, not the address
MAX_JOINERS = 3
#: a leading article is dropped only when at least this much is left (so "the shop" never means "shop")
ARTICLE_MIN_WORDS = 2
ARTICLE_MIN_CHARS = 10
#: an identifier cut off counts from this many folded characters and this share of the variant on
CUT_MIN_CHARS = 12
CUT_MIN_SHARE = 0.6
_ARTICLE = re.compile(r"^\s*(?:a|an|the)\s+(.+)$", re.IGNORECASE | re.DOTALL)


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
    if (spelled := spell_digits(fold(value))) is not None:  # "three weeks" also as "3 weeks"
        out.append(spelled.text)
    if re.search(r"\b0+\d", value):
        out.append(re.sub(r"\b0+(\d)", r"\1", value))
    if (m := _ARTICLE.match(value)) and (
        len(m.group(1).split()) >= ARTICLE_MIN_WORDS and len(normalise(m.group(1))) >= ARTICLE_MIN_CHARS
    ):
        out.append(m.group(1))
    return out + transliterations(value)  # a Cyrillic or Greek target in Latin letters (matching.translit)


def _digits(s: str) -> int:
    return sum(c.isdigit() for c in s)


def _merge(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


@lru_cache(maxsize=4096)
def _matcher(value: str, variants: tuple[str, ...]) -> TargetMatcher:
    return TargetMatcher(value, variants)


@dataclass(frozen=True)
class TargetMatcher:
    """The target z with the variants a forget request names and the paraphrases the matcher adds."""

    value: str
    given: tuple[str, ...] = field(default=())

    @classmethod
    def of(cls, value: str, variants: Iterable[str] = ()) -> TargetMatcher:
        """The matcher of this target and variants: one object per target in a process, however many
        places ask for it, so its paraphrases are worked out once per session, not once per caller."""
        return _matcher(value, tuple(variants)) if cls is TargetMatcher else cls(value, tuple(variants))

    @cached_property
    def variants(self) -> list[str]:
        """Target, given variants and paraphrases, one per folded form, long enough to mean it."""
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
    def _numeric(self) -> bool:
        """Spelled-out numbers are read only for a target with digits (elsewhere they cannot matter)."""
        return any(c.isdigit() for n in self._needles for c in n)

    @cached_property
    def _joined(self) -> list[re.Pattern[str]]:
        """Regexes over a folded text for the variants in comma-separated parts, joining words allowed
        between the parts."""
        joiner = rf"(?: (?:{'|'.join(JOINERS)})(?= )){{0,{MAX_JOINERS}}} ?"
        out = []
        for v in self.variants:
            parts = [n for p in v.split(",") if (n := normalise(p))]
            if len(parts) > 1:
                out.append(re.compile(joiner.join(" ?".join(re.escape(c) for c in p) for p in parts)))
        return out

    def _forms(self, text: str) -> list[Folded]:
        base = fold(text)
        if self._numeric and (spelled := spell_digits(base)) is not None:
            return [base, spelled]
        return [base]

    @cached_property
    def _cut(self) -> list[tuple[str, int]]:
        """(needle, shortest prefix that counts) for the needles long enough to be cut off."""
        out = []
        for n in self._needles:
            shortest = max(CUT_MIN_CHARS, math.ceil(CUT_MIN_SHARE * len(n)))
            if shortest < len(n):
                out.append((n, shortest))
        return out

    def _cut_spans(self, squashed: str) -> list[tuple[int, int]]:
        """Squashed spans where a needle stands cut off (the module's docstring)."""
        out = []
        for n, shortest in self._cut:
            at = squashed.find(n[:shortest])
            while at >= 0:
                k = shortest
                while k < len(n) and at + k < len(squashed) and squashed[at + k] == n[k]:
                    k += 1
                if at + k == len(squashed) and 2 * _digits(n[:k]) >= _digits(n):
                    out.append((at, at + k))
                at = squashed.find(n[:shortest], at + 1)
        return out

    def _hit(self, folded: str) -> bool:
        squashed = folded.replace(" ", "")
        return (
            any(n in squashed for n in self._needles)
            or any(r.search(folded) for r in self._joined)
            or bool(self._cut and self._cut_spans(squashed))
        )

    def found_in(self, text: str) -> bool:
        """Does ``text`` hold the target or a plausible rewriting of it (the module's docstring)? The same
        answer as ``bool(spans(text))``, without computing where."""
        folded = fold_text(text)
        if self._hit(folded):
            return True
        if self._numeric and any(w in NUMBER_WORDS for w in folded.split(" ")):
            spelled = spell_digits(fold(text))
            return spelled is not None and self._hit(spelled.text)
        return False

    def spans(self, text: str) -> list[tuple[int, int]]:
        """The raw spans of ``text`` where ``found_in`` finds the target, merged where they overlap: what
        a redaction (B6), an excision or a mask removes is exactly what the audits count."""
        out: list[tuple[int, int]] = []
        for f in self._forms(text):
            keep = [i for i, c in enumerate(f.text) if c != " "]  # squashed position -> folded position
            squashed = f.squashed
            for n in self._needles:
                at = squashed.find(n)
                while at >= 0:
                    out.append(f.raw_span(keep[at], keep[at + len(n) - 1] + 1))
                    at = squashed.find(n, at + 1)
            for a, b in self._cut_spans(squashed):
                out.append(f.raw_span(keep[a], keep[b - 1] + 1))
            for r in self._joined:
                out.extend(f.raw_span(*m.span()) for m in r.finditer(f.text) if m.end() > m.start())
        return _merge(out)

    def redact(self, text: str, replacement: str | Callable[[str], str]) -> str:
        """``text`` with every span holding the target replaced (``replacement`` may be a function of the
        raw span it replaces)."""
        spans = self.spans(text)
        if not spans:
            return text
        sub = replacement if callable(replacement) else (lambda _s: replacement)
        parts, pos = [], 0
        for a, b in spans:
            parts.append(text[pos:a])
            parts.append(sub(text[a:b]))
            pos = b
        parts.append(text[pos:])
        return "".join(parts)


def contains_target(text: str, target: str, variants: Iterable[str] = ()) -> bool:
    """Shorthand for ``TargetMatcher.of(target, variants).found_in(text)``."""
    return TargetMatcher.of(target, variants).found_in(text)
