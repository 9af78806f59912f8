"""Shards: one run's sessions split across machines, and joined back into the run it would have been.

``--shard I/N`` keeps session i (numbered across the whole run, suites in order) when i mod N = I - 1.
A shard's sessions keep their run-wide ids (``s{i}``) and seeds, so session i is the same whichever
shard ran it. ``merge`` joins shard bundles (the same model, engine, decoding, suite and seed; no session
twice) into one bundle, or shard audits into one audit whose statistics are recomputed over the union:
merged shards give the rows and p-values of a single run on the same sessions.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from eu_audit.errors import BadInput

if TYPE_CHECKING:
    from eu_audit.audits.model import AuditReport

T = TypeVar("T")
_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
_INDEX = re.compile(r"^s(\d+)(?:/|$)")
#: header facts that legitimately differ between shards of one run (each serve, each run's own key)
PER_SHARD_FACTS = (
    "shard",
    "serve_log_digest",
    "serve_control_key",
    "serve_info",
    "agent",
    "serve",
    "concurrency",  # how a shard was driven, not what it measured (attribution is the same)
)


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        m = _SHARD.match(text)
        if not m:
            raise BadInput(f"--shard {text!r}: expected I/N, e.g. 1/4")
        i, n = int(m.group(1)), int(m.group(2))
        if n < 1 or not 1 <= i <= n:
            raise BadInput(f"--shard {text}: I must be between 1 and N (N >= 1)")
        return cls(i, n)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def keeps(self, i: int) -> bool:
        return i % self.count == self.index - 1

    def select(self, items: Sequence[T]) -> list[tuple[int, T]]:
        """(run-wide index, item) of the items this shard runs."""
        return [(i, x) for i, x in enumerate(items) if self.keeps(i)]


def session_index(session_id: str) -> int:
    m = _INDEX.match(session_id)
    return int(m.group(1)) if m else 1 << 30


def check_same_run(headers: Sequence[tuple[Path, Any]]) -> None:
    """Shard headers agree on everything a session depends on; distinct shards of one N."""
    first_path, first = headers[0]
    keys = (
        "schema_version",
        "tool_version",
        "model",
        "engine",
        "decoding",
        "seed",
        "suite",
        "checkpoint_policy",
    )
    ref = first.model_dump(mode="json")
    shards = []
    for path, h in headers:
        d = h.model_dump(mode="json")
        for k in keys:
            if d[k] != ref[k]:
                raise BadInput(
                    f"its {k} differs from {first_path}'s: not a shard of the same run", path=str(path)
                )
        facts = {k: v for k, v in d["engine_facts"].items() if k not in PER_SHARD_FACTS}
        if facts != {k: v for k, v in ref["engine_facts"].items() if k not in PER_SHARD_FACTS}:
            raise BadInput(f"its engine facts differ from {first_path}'s: not the same run", path=str(path))
        shards.append(d["engine_facts"].get("shard"))
    given = [s for s in shards if s]
    if given and len(set(given)) != len(given):
        raise BadInput(f"the same shard appears twice ({', '.join(sorted(given))})")
    if given and len({s.split("/")[1] for s in given}) > 1:
        raise BadInput(f"shards of different splits ({', '.join(sorted(given))})")


def merge_bundles(paths: Sequence[Path], out: Path, *, force: bool = False) -> Path:
    """Shard bundles -> one bundle (sessions in run order), refused before anything is written when they
    are not shards of one run or a session appears twice."""
    from eu_audit.bundle.io import read_bundle, write_bundle
    from eu_audit.jsonl import check_output_path
    from eu_audit.trace.session import Bundle

    if len(paths) < 2:
        raise BadInput("merge needs at least two files")
    check_output_path(out, force=force)
    bundles = [read_bundle(p) for p in paths]
    check_same_run([(p, b.header) for p, b in zip(paths, bundles, strict=True)])
    seen: dict[str, Path] = {}
    for p, b in zip(paths, bundles, strict=True):
        for s in b.sessions:
            if s.session_id in seen:
                raise BadInput(
                    f"session '{s.session_id}' is also in {seen[s.session_id]} (overlapping shards)",
                    path=str(p),
                )
            seen[s.session_id] = p
    facts = {k: v for k, v in bundles[0].header.engine_facts.items() if k not in PER_SHARD_FACTS}
    facts["merged_from"] = [b.digest for b in bundles]
    header = bundles[0].header.model_copy(update={"engine_facts": facts})
    sessions = sorted(
        (s for b in bundles for s in b.sessions), key=lambda s: (session_index(s.session_id), s.session_id)
    )
    write_bundle(out, Bundle(header=header, sessions=sessions, path=out).records())
    return out


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
    from eu_audit.audits.model import read_report
    from eu_audit.summary import cells_of, drop_probes, floor_self_of, methods_of

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
        (st for r in reports for st in r.states), key=lambda st: (session_index(st.session_id), st.session_id)
    )
    base = reports[0]
    methods = methods_of(states)
    dropped = drop_probes(states, base.probes)
    cost = {
        "wall_s": round(sum(float(r.cost.get("wall_s", 0) or 0) for r in reports), 1),
        "engine": str(base.cost.get("engine", base.engine)),
        "shards": len(reports),
    }
    merged = base.model_copy(
        update={
            "bundle": ", ".join(r.bundle for r in reports),
            "bundle_digest": ",".join(r.bundle_digest for r in reports),
            "methods": methods,
            "suites": sorted({st.suite for st in states}),
            "probes_dropped": dropped,
            "floor_self": floor_self_of(states),
            "states": states,
            "cells": cells_of(states, methods, base.margin, base.floor),
            "gates": [],
            "errors": sum(1 for st in states if st.error),
            "cost": cost,
        }
    )
    rules = shard_rules(reports)
    if rules:  # each shard's gate was decided on its own sessions; the run's is decided on all of them
        from eu_audit.gate import evaluate

        merged.gates = evaluate(merged, rules)
    return merged


def shard_rules(reports: Sequence[AuditReport]) -> list[str]:
    """Every rule any shard was gated with, in first-seen order: a merge decides each on the union of the
    sessions, so no rule a shard was held to is left undecided (the pseudo-rule for errored states is
    added again by ``gate.evaluate`` when the union has one)."""
    from eu_audit.gate import gated_rules

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
    from eu_audit.audits.model import read_report

    return read_report(paths[0]) if len(paths) == 1 else merge_reports(paths)


def shard_bundle(path: Path, shard: Shard) -> Path:
    """The sessions of ``path`` that fall in ``shard`` (a post-forget state goes with its recorded
    session), as a bundle of its own beside the input: ``<stem>.shard-I-of-N.jsonl``, derived
    deterministically from the input and replaced on each run."""
    from eu_audit.bundle.io import read_bundle, write_bundle
    from eu_audit.trace.session import Bundle

    bundle = read_bundle(path)
    kept = [
        s for s in bundle.sessions if shard.keeps(session_index(s.session.parent_session or s.session_id))
    ]
    if not kept:
        raise BadInput(f"--shard {shard}: no session of this bundle falls in this shard", path=str(path))
    out = path.with_name(f"{path.stem}.shard-{shard.index}-of-{shard.count}{path.suffix or '.jsonl'}")
    facts = {**bundle.header.engine_facts, "shard": str(shard)}
    header = bundle.header.model_copy(update={"engine_facts": facts})
    write_bundle(out, Bundle(header=header, sessions=kept, path=out).records())
    return out
