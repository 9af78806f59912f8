"""Normalised matching of a target and its variants in text (case, whitespace, punctuation, grouping)."""

from __future__ import annotations

import re
from collections.abc import Iterable

_NON_ALNUM = re.compile(r"[^0-9a-z]+")


def normalise(text: str) -> str:
    """Lower-case and drop everything but letters and digits: 'DE89 3704-0044' -> 'de8937040044'."""
    return _NON_ALNUM.sub("", text.lower())


def contains_target(text: str, target: str, variants: Iterable[str] = ()) -> bool:
    hay = normalise(text)
    for needle in (target, *variants):
        n = normalise(needle)
        if n and n in hay:
            return True
    return False
