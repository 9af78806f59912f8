"""Numbers a model spells out: "twelve Linden Street", "eight three two one four", "three hundred and
seventy-two". ``spell_digits`` rewrites a folded text's number words as digits, each number mapped to the
raw span of its words, so "twelve linden street" is found by the needle "12lindenstreet".

A run of number words is read as a reader would say it: each number below 1000 ("three hundred and
seventy two" is 372, "twenty nine" is 29), one after the other ("five five zero" is 550, "(three hundred
and seventy-two) two hundred and ninety-four" is 372294): a unit after a unit, or a tens after anything
but "hundred", starts the next number.
"""

from __future__ import annotations

from dataclasses import dataclass

from eu_audit.matching.fold import Folded

_UNIT_WORDS = "zero one two three four five six seven eight nine"
_TEEN_WORDS = "ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen"
_TENS_WORDS = "twenty thirty forty fifty sixty seventy eighty ninety"
UNITS = {w: i for i, w in enumerate(_UNIT_WORDS.split())}
TEENS = {w: 10 + i for i, w in enumerate(_TEEN_WORDS.split())}
TENS = {w: 10 * (i + 2) for i, w in enumerate(_TENS_WORDS.split())}
NUMBER_WORDS = {**UNITS, **TEENS, **TENS, "hundred": 100}


@dataclass
class _Number:
    value: int
    stage: str  # "unit", "tens", "teen", "hundred" (after it), "hundred-tens", "done"
    first: int  # index of its first word
    last: int  # index of its last word


def _numbers(words: list[str]) -> list[_Number | None]:
    """Per word: the number it ends (the last word of each number carries it), None elsewhere."""
    found: list[_Number] = []
    cur: _Number | None = None

    def start(value: int, stage: str, i: int) -> _Number:
        n = _Number(value, stage, i, i)
        found.append(n)
        return n

    for i, w in enumerate(words):
        if w == "and" and cur is not None and cur.stage == "hundred" and cur.last == i - 1:
            nxt = words[i + 1] if i + 1 < len(words) else ""
            if nxt in UNITS or nxt in TEENS or nxt in TENS:
                continue  # "three hundred and seventy two": the "and" belongs to the number
        if w not in NUMBER_WORDS:
            cur = None
            continue
        near = cur is not None and cur.last >= i - 2  # the same run (an "and" may stand between)
        if w in UNITS:
            if near and cur is not None and cur.stage in ("tens", "hundred", "hundred-tens"):
                cur.value += UNITS[w]
                cur.stage, cur.last = "done", i
            else:
                cur = start(UNITS[w], "unit", i)
        elif w in TEENS:
            if near and cur is not None and cur.stage == "hundred":
                cur.value += TEENS[w]
                cur.stage, cur.last = "done", i
            else:
                cur = start(TEENS[w], "done", i)
        elif w in TENS:
            if near and cur is not None and cur.stage == "hundred":
                cur.value += TENS[w]
                cur.stage, cur.last = "hundred-tens", i
            else:
                cur = start(TENS[w], "tens", i)
        else:  # hundred
            if near and cur is not None and cur.stage == "unit" and cur.value > 0:
                cur.value *= 100
                cur.stage, cur.last = "hundred", i
            else:
                cur = None  # "hundred" alone is a word, not a number
    ends: list[_Number | None] = [None] * len(words)
    for n in found:
        ends[n.last] = n
    return ends


def spell_digits(f: Folded) -> Folded | None:
    """``f`` with its number words written as digits (numbers in a row joined, as "five five" is 55);
    None when it has none."""
    bounds: list[tuple[int, int]] = []  # (start, end) of each word in f.text
    pos = 0
    for w in f.text.split(" "):
        bounds.append((pos, pos + len(w)))
        pos += len(w) + 1
    words = [f.text[a:b] for a, b in bounds]
    ends = _numbers(words)
    firsts = {n.first: n for n in ends if n is not None}
    if not firsts:
        return None
    chars: list[str] = []
    starts: list[int] = []
    stops: list[int] = []
    i = 0
    glue = False  # the previous piece was a number: the next number joins it without a space
    while i < len(words):
        a, b = bounds[i]
        if a == b:  # an empty text has one empty word
            i += 1
            continue
        if i in firsts:
            n = firsts[i]
            span = (f.starts[a], f.ends[bounds[n.last][1] - 1])
            piece, spans = str(n.value), [span] * len(str(n.value))
            number, i = True, n.last + 1
        else:
            piece, spans = words[i], [(f.starts[k], f.ends[k]) for k in range(a, b)]
            number, i = False, i + 1
        if chars and not (number and glue):
            chars.append(" ")
            starts.append(spans[0][0])
            stops.append(spans[0][0])
        chars.extend(piece)
        starts.extend(s for s, _ in spans)
        stops.extend(e for _, e in spans)
        glue = number
    return Folded("".join(chars), tuple(starts), tuple(stops))
