"""Latin spellings of a target written in Cyrillic or Greek, as a model or a person writes them.

A model asked about "улица Ленина 7" may answer "ulitsa Lenina 7"; about "Ελένη Παπαδοπούλου", "Eleni
Papadopoulou". No single scheme is the one people use, so a target in these scripts gets one variant per
common scheme: the English-press one (BGN/PCGN for Russian and Ukrainian, ELOT 743 for Greek), the
popular one that writes "y" for "ий" and "h" for "х" (Dmitry, Mihail), and the scholarly one (ISO 9,
ISO 843) with its marks dropped, as the matcher drops every mark ("Dmitrij", "Mihail"). Each is a variant
like any other (``TargetMatcher.variants``): a Latin target gets none, so no Latin text ever matches a
Latin target by way of these tables.
"""

from __future__ import annotations

import unicodedata

# Cyrillic: letter -> (BGN/PCGN, popular, ISO 9 folded), lower case
_CYRILLIC: dict[str, tuple[str, str, str]] = {
    "а": ("a", "a", "a"), "б": ("b", "b", "b"), "в": ("v", "v", "v"), "г": ("g", "g", "g"),
    "д": ("d", "d", "d"), "е": ("e", "e", "e"), "ё": ("yo", "yo", "e"), "ж": ("zh", "zh", "z"),
    "з": ("z", "z", "z"), "и": ("i", "i", "i"), "й": ("y", "i", "j"), "к": ("k", "k", "k"),
    "л": ("l", "l", "l"), "м": ("m", "m", "m"), "н": ("n", "n", "n"), "о": ("o", "o", "o"),
    "п": ("p", "p", "p"), "р": ("r", "r", "r"), "с": ("s", "s", "s"), "т": ("t", "t", "t"),
    "у": ("u", "u", "u"), "ф": ("f", "f", "f"), "х": ("kh", "h", "h"), "ц": ("ts", "ts", "c"),
    "ч": ("ch", "ch", "c"), "ш": ("sh", "sh", "s"), "щ": ("shch", "sch", "s"), "ъ": ("", "", ""),
    "ы": ("y", "y", "y"), "ь": ("", "", ""), "э": ("e", "e", "e"), "ю": ("yu", "yu", "u"),
    "я": ("ya", "ya", "a"), "і": ("i", "i", "i"), "ї": ("yi", "i", "i"), "є": ("ye", "e", "e"),
    "ґ": ("g", "g", "g"),
}  # fmt: skip
#: letter pairs written as one sound in a scheme: pair -> (BGN/PCGN, popular, ISO 9 folded)
_CYRILLIC_PAIRS = {"ий": ("iy", "y", "ij"), "ый": ("yy", "y", "yj")}

# Greek, accents dropped first: letter -> (ELOT 743, popular, ISO 843 folded)
_GREEK: dict[str, tuple[str, str, str]] = {
    "α": ("a", "a", "a"), "β": ("v", "v", "v"), "γ": ("g", "g", "g"), "δ": ("d", "d", "d"),
    "ε": ("e", "e", "e"), "ζ": ("z", "z", "z"), "η": ("i", "i", "i"), "θ": ("th", "th", "th"),
    "ι": ("i", "i", "i"), "κ": ("k", "k", "k"), "λ": ("l", "l", "l"), "μ": ("m", "m", "m"),
    "ν": ("n", "n", "n"), "ξ": ("x", "x", "x"), "ο": ("o", "o", "o"), "π": ("p", "p", "p"),
    "ρ": ("r", "r", "r"), "σ": ("s", "s", "s"), "ς": ("s", "s", "s"), "τ": ("t", "t", "t"),
    "υ": ("y", "i", "y"), "φ": ("f", "f", "f"), "χ": ("ch", "h", "ch"), "ψ": ("ps", "ps", "ps"),
    "ω": ("o", "o", "o"),
}  # fmt: skip
_GREEK_PAIRS = {
    "ου": ("ou", "ou", "ou"), "αυ": ("av", "av", "ay"), "ευ": ("ev", "ev", "ey"), "μπ": ("b", "b", "mp"),
    "ντ": ("nt", "d", "nt"), "γγ": ("ng", "ng", "gg"), "γκ": ("gk", "g", "gk"),
}  # fmt: skip
SCHEMES = 3


def _bare(text: str) -> str:
    """Accents and marks dropped (Greek tonos, dialytika; Cyrillic й and ё are kept whole)."""
    keep = {"й", "ё", "ї", "Й", "Ё", "Ї"}
    return "".join(
        c
        if c in keep
        else "".join(d for d in unicodedata.normalize("NFD", c) if not unicodedata.combining(d))
        for c in text
    )


def _spell(
    text: str, letters: dict[str, tuple[str, str, str]], pairs: dict[str, tuple[str, str, str]], k: int
) -> str:
    out, i, low = [], 0, text.lower()
    while i < len(text):
        pair = low[i : i + 2]
        if pair in pairs:
            got, step = pairs[pair][k], 2
        elif low[i] in letters:
            got, step = letters[low[i]][k], 1
        else:
            got, step = text[i], 1
        out.append(got.capitalize() if text[i].isupper() and got else got)
        i += step
    return "".join(out)


def transliterations(value: str) -> list[str]:
    """The target in Latin letters, one spelling per scheme; [] for a target with no Cyrillic or Greek."""
    bare = _bare(value)
    low = bare.lower()
    tables = []
    if any(c in _CYRILLIC for c in low):
        tables.append((_CYRILLIC, _CYRILLIC_PAIRS))
    if any(c in _GREEK for c in low):
        tables.append((_GREEK, _GREEK_PAIRS))
    out: list[str] = []
    for k in range(SCHEMES):
        text = bare
        for letters, pairs in tables:
            text = _spell(text, letters, pairs, k)
        if text not in out and text != value:
            out.append(text)
    return out
