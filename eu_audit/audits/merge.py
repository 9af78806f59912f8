"""Shard audits joined into the audit of the union of their sessions: states joined, probes dropped,
floors, cells and p-values recomputed over all of them, so merged shards give the rows and p-values of a
single run on the same sessions. (Shards themselves, and joined bundles: ``eu_audit.shards``.)"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eu_audit.audits.gate import gated_rules
from eu_audit.audits.model import AuditReport, read_report
from eu_audit.audits.summary import decided_again, floor_self_of, methods_of
from eu_audit.errors import BadInput
from eu_audit.shards import run_order
from eu_audit.trace.records import session_number

#: what every shard audit of one run agrees on
SAME_AUDIT = (
    "model",
    "model_digest",
    "engine",
    "seed",
    "k",
    "temperature",
    "margin",
    "alpha",
    "floor",
    "probes",
    "rescored_by",  # texts scored by one matcher: a run re-scored in part is not one run
)


def merge_reports(paths: Sequence[Path]) -> AuditReport:
    """Shard audits -> the audit of the union of their sessions: states joined, probes dropped, floors,
    cells and p-values recomputed over all of them, exactly as one run on the same sessions would."""
    if len(paths) < 2:
        raise BadInput("merge needs at least two files")
    reports = [read_report(p) for p in paths]
    first = reports[0].model_dump(mode="json")
    for p, r in zip(paths[1:], reports[1:], strict=True):
        d = r.model_dump(mode="json")
        for k in SAME_AUDIT:
            if d[k] != first[k]:
                raise BadInput(
                    f"its {k} differs from {paths[0]}'s: not a shard of the same audit", path=str(p)
                )
    seen: dict[tuple[str, str], Path] = {}
    for p, r in zip(paths, reports, strict=True):
        for st in r.states:
            key = (st.session_id, st.method)
            if key in seen:
                raise BadInput(
                    f"state {key[0]} / {key[1]} is also in {seen[key]} (overlapping shards)", path=str(p)
                )
            seen[key] = p
    states = sorted(
        (st for r in reports for st in r.states),
        key=lambda st: run_order(session_number(st.session_id), st.session_id),
    )
    base = reports[0]
    tampering = []  # every part's findings: one in any part fails the union's gate
    for r in reports:
        tampering += [t for t in r.tampering if t not in tampering]
    cost = {
        "wall_s": round(sum(float(r.cost.get("wall_s", 0) or 0) for r in reports), 1),
        "engine": str(base.cost.get("engine", base.engine)),
        "shards": len(reports),
    }
    # each shard's gate was decided on its own sessions; the run's is decided on all of them
    return decided_again(
        base,
        states,
        shard_rules(reports),
        bundle=", ".join(r.bundle for r in reports),
        bundle_digest=",".join(r.bundle_digest for r in reports),
        methods=methods_of(states),
        suites=sorted({st.suite for st in states}),
        floor_self=floor_self_of(states),
        errors=sum(1 for st in states if st.error),
        cost=cost,
        tampering=tampering,
        engine_facts=_joined_facts(reports),
        plugins=sorted({p for r in reports for p in r.plugins}),
        defined_by={k: v for r in reports for k, v in r.defined_by.items()},
    )


#: facts of how one part's recording ended: the union's only where every part says the same
RUN_ENDINGS = ("stopped", "interrupted")


def _joined_facts(reports: Sequence[AuditReport]) -> dict[str, Any]:
    """The first part's engine facts, less how one part ended where the parts differ (a run in rounds
    continued by a slice did not stop where its first part did)."""
    facts = dict(reports[0].engine_facts)
    for key in RUN_ENDINGS:
        if any(r.engine_facts.get(key) != facts.get(key) for r in reports[1:]):
            facts.pop(key, None)
    return facts


def shard_rules(reports: Sequence[AuditReport]) -> list[str]:
    """Every rule any shard was gated with, in first-seen order: a merge decides each on the union of the
    sessions, so no rule a shard was held to is left undecided (the pseudo-rule for errored states is
    added again by ``gate.evaluate`` when the union has one)."""
    out: list[str] = []
    for r in reports:
        out += [rule for rule in gated_rules(r) if rule not in out]
    return out


def _natural(path: Path) -> tuple[Any, ...]:
    """audit-slice-2 before audit-slice-10: numbers in a name compare as numbers."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name))


def shard_audits(folder: Path) -> list[Path]:
    """The shard audits in ``folder`` (its ``*.json``, in natural order): one run's audit, kept in pieces so
    the report's rows hold each state once, never a merged copy beside its shards."""
    if not folder.is_dir():
        raise BadInput("no such folder", path=str(folder))
    found = sorted((p for p in folder.glob("*.json") if p.is_file()), key=_natural)
    if not found:
        raise BadInput("no shard audits (*.json) in this folder", path=str(folder))
    return found


def read_audits(paths: Sequence[Path]) -> AuditReport:
    """One audit from a run's shard audits: the one file as it is, more merged (``merge_reports``)."""
    return read_report(paths[0]) if len(paths) == 1 else merge_reports(paths)
