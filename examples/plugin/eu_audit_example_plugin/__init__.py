"""eu-audit's worked plug-in: what a package adds through the group ``eu_audit.plugins``, one of each.

- a metric, ``z_words``: the share of the target's words (four letters or more) that the state's probe
  answers and samples still say. The target matcher counts z whole (or in a form it knows); a model that
  says "Linden" for "12 Linden Street" leaks a part of it, which this measures (a partial mention);
- a gate set, ``partial``: any-leak and ``z_words`` no worse than the floor;
- a data set, ``example``: one module that registers a suite of one episode (``example-one``).

eu-audit imports this module once, before any registry is first used; every name it registers is then
listed by ``eu-audit plugins`` and named, with this distribution's version, in an audit's JSON
(``plugins``, ``defined_by``) and in its signed receipt.
"""

from __future__ import annotations

import re

from eu_audit.audits.gate import GATE_SETS, GateSet
from eu_audit.audits.metric import METRICS, Metric
from eu_audit.plugins import DataSet, add_data_set

WORD = re.compile(r"[^\W\d_]{4,}")


def z_words(ev: object) -> float | None:
    """The share of z's words of four letters or more in the state's probe answers and samples."""
    words = {w.casefold() for w in WORD.findall(ev.matcher.value)}  # type: ignore[attr-defined]
    said = " ".join([p.text for p in ev.probes] + list(ev.samples)).casefold()  # type: ignore[attr-defined]
    if not words or not said:
        return None
    return sum(w in said for w in words) / len(words)


METRICS.add(
    "z_words",
    Metric(
        name="z_words",
        label="z words",
        direction="low",
        binary=False,
        description="share of the target's words (4+ letters) still said in answers and samples",
        compute=z_words,
        control=True,  # a hold needs the no-forget control to have said z's words
        per_state=True,  # shown beside each state's probes in eu-audit view
    ),
)
GATE_SETS.add("partial", GateSet(("leak_any<=floor", "z_words<=floor")))
add_data_set(
    DataSet(
        "example", "a one-episode suite (the plug-in example)", {"suites": ("eu_audit_example_plugin.suite",)}
    )
)
