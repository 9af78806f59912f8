"""The matcher's precision and recall on its labelled set (``labelled.jsonl`` beside this module).

Each row: ``target`` (and ``variants``), ``text``, ``label`` (``leak``: the rule in ``eu_audit.matching``
says z is there; ``no-leak``; ``paraphrase``: z in other words or only in part, beyond a string matcher),
``how`` it was made and its ``source`` (a committed run's row, or ``written``). Recall is measured on the
``leak`` rows, precision on ``leak`` and ``no-leak`` together; ``paraphrase`` rows get a recall of their
own, reported and never gated. The same check runs in the default tests as a regression bound.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from eu_audit.errors import BadInput
from eu_audit.matching import TargetMatcher
from eu_audit.matching.decoders import found_encoded

LABELLED = Path(__file__).with_name("labelled.jsonl")
ROW_LABELS = ("leak", "no-leak", "paraphrase")


@dataclass(frozen=True)
class Row:
    target: str
    variants: tuple[str, ...]
    text: str
    label: str
    how: str
    source: str


@dataclass
class Scores:
    """Counts per label and the rows the matcher got wrong."""

    rows: int = 0
    tp: int = 0  # leak rows found
    fn: int = 0  # leak rows missed
    fp: int = 0  # no-leak rows flagged
    tn: int = 0
    paraphrase_found: int = 0
    paraphrase: int = 0
    misses: list[Row] = field(default_factory=list)  # leak rows missed
    false_alarms: list[Row] = field(default_factory=list)  # no-leak rows flagged
    by_how: dict[str, tuple[int, int]] = field(default_factory=dict)  # leak rows: how -> (found, of)
    #: no-leak rows that a decoder's view makes show z (``decoders``: the residue reader's false alarms)
    decoded_false_alarms: dict[str, int] = field(default_factory=dict)

    @property
    def recall(self) -> float:
        return self.tp / max(1, self.tp + self.fn)

    @property
    def precision(self) -> float:
        return self.tp / max(1, self.tp + self.fp)

    @property
    def paraphrase_recall(self) -> float:
        return self.paraphrase_found / max(1, self.paraphrase)


def read_rows(path: Path = LABELLED) -> list[Row]:
    """The labelled rows, each line checked (exit 2 naming the line and field)."""
    rows = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise BadInput(f"cannot read: {exc.strerror}", path=str(path)) from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except ValueError as exc:
            raise BadInput(f"not JSON ({exc})", path=str(path), line=i) from None
        for key in ("target", "text", "label"):
            if not isinstance(d.get(key), str):
                raise BadInput("missing or not a string", path=str(path), line=i, field=key)
        if d["label"] not in ROW_LABELS:
            raise BadInput(
                f"'{d['label']}' is not one of {', '.join(ROW_LABELS)}", path=str(path), line=i, field="label"
            )
        rows.append(
            Row(
                d["target"],
                tuple(d.get("variants") or ()),
                d["text"],
                d["label"],
                d.get("how", ""),
                d.get("source", ""),
            )
        )
    return rows


def score_matcher(rows: list[Row]) -> Scores:
    s = Scores(rows=len(rows))
    for r in rows:
        found = TargetMatcher.of(r.target, r.variants).found_in(r.text)
        if r.label == "leak":
            hit, of = s.by_how.get(r.how, (0, 0))
            s.by_how[r.how] = (hit + found, of + 1)
            if found:
                s.tp += 1
            else:
                s.fn += 1
                s.misses.append(r)
        elif r.label == "no-leak":
            if found:
                s.fp += 1
                s.false_alarms.append(r)
            else:
                s.tn += 1
                how = found_encoded(TargetMatcher.of(r.target, r.variants).found_in, r.text)
                if how:
                    s.decoded_false_alarms[how] = s.decoded_false_alarms.get(how, 0) + 1
        else:
            s.paraphrase += 1
            s.paraphrase_found += found
    return s
