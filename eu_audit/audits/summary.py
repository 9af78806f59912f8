"""Summarising an audit: the states' values against the floor, the probes the floor itself leaks on
(dropped), each method x suite cell with its paired statistics, and the rows of the report. Running the
audit (rebuilding states, asking probes) is ``eu_audit.audit``; this is what both sides share after it,
and what ``merge`` recomputes over joined shards."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from statistics import fmean
from typing import TYPE_CHECKING, Any

from eu_audit.audits.metric import METRICS
from eu_audit.audits.metrics import (
    ngram_distance,
    token_agreement,
    tool_distribution,
    total_variation,
)
from eu_audit.audits.model import FLOOR, OWN_FLOOR, AuditReport, Cell, StateAudit
from eu_audit.audits.own_floor import checks as own_floor_checks
from eu_audit.audits.scoring import FloorPair, score_against_floor, without_floor
from eu_audit.build_info import source_commit
from eu_audit.bundle.io import file_digest
from eu_audit.plugins import LOADED, added_by_plugins
from eu_audit.stats import mcnemar_exact, tost_paired, wilcoxon_paired
from eu_audit.trace.session import Bundle, SessionTrace

if TYPE_CHECKING:
    from eu_audit.audits.options import AuditOptions


def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return fmean(vals) if vals else None


def summarise(
    bundle: Bundle,
    path: Path,
    unlearned: Path | None,
    model: str,
    opts: AuditOptions,
    probes_ids: list[str],
    states: list[StateAudit],
    sessions: list[SessionTrace],
) -> AuditReport:
    suites = sorted({s.suite for s in states})
    by_key = {(s.session_id, s.method): s for s in states}
    traces = {(t.session.parent_session or t.session_id, t.session.method or "recorded"): t for t in sessions}
    dropped = drop_probes(states, probes_ids)
    for st in states:
        if st.error:
            continue
        ref = by_key.get((st.session_id, FLOOR))
        ref_trace = traces.get((st.session_id, FLOOR))
        mine = traces.get((st.session_id, st.method))
        if not opts.floor or ref is None or ref.error or ref_trace is None or mine is None:
            without_floor(st)
            continue
        score_against_floor(FloorPair(st, ref, mine, ref_trace))
    methods = methods_of(states)
    return AuditReport(
        bundle=str(path),
        bundle_digest=file_digest(path),
        tool_commit=source_commit(),
        command=opts.command,
        unlearned=str(unlearned) if unlearned else None,
        model=model,
        model_digest=bundle.header.model.weight_digest,
        engine_facts=dict(bundle.header.engine_facts),
        seed=opts.seed,
        k=opts.k,
        temperature=opts.temperature,
        margin=opts.margin,
        alpha=opts.alpha,
        floor=opts.floor,
        methods=methods,
        suites=suites,
        probes=probes_ids,
        probes_dropped=dropped,
        floor_self=floor_self_of(states),
        states=states,
        cells=cells_of(states, methods, opts.margin, opts.floor),
        errors=sum(1 for s in states if s.error),
        own_floor=own_floor_checks(states, opts.alpha),
        plugins=[p.said() for p in LOADED],
        defined_by=added_by_plugins(),
    )


def methods_of(states: Sequence[StateAudit]) -> list[str]:
    """The methods of these states in their registered places; pseudo-methods (agent, serving) last.
    eu-audit's own floor (``OWN_FLOOR``) is no method: it is read by ``own_floor.checks`` alone."""
    from eu_audit.methods import METHODS

    return sorted(
        dict.fromkeys(s.method for s in states if s.method != OWN_FLOOR),
        key=lambda m: (METHODS.get(m).place if m in METHODS else float("inf"), m),
    )


def drop_probes(states: Sequence[StateAudit], probes_ids: Sequence[str]) -> dict[str, list[str]]:
    """Per suite, each probe that leaked on the floor itself, named with the session where it did
    ("direct in s3"); every state's Leak@probes over the probes its own session's floor did not leak on.
    Dropped only where it leaked: one floor answer holding z (a model that guesses it, or an agent that
    puts z in its reference's answers) never blinds a probe on every other session. Over all the run's
    sessions: merged shards drop what one run would."""
    on_floor: dict[str, set[str]] = {}  # session -> the probes its floor leaked on
    for s in states:
        if s.method == FLOOR and not s.error:
            on_floor[s.session_id] = {o.probe for o in s.probes if o.leaked and o.probe in probes_ids}
    dropped: dict[str, list[str]] = {}
    for suite in sorted({s.suite for s in states}):
        floor_states = [s for s in states if s.suite == suite and s.method == FLOOR and not s.error]
        dropped[suite] = [
            f"{p} in {s.session_id}" for p in probes_ids for s in floor_states if p in on_floor[s.session_id]
        ]
    for st in states:
        if not st.error:
            kept = [o for o in st.probes if o.probe not in on_floor.get(st.session_id, set())]
            st.values["leak_probes"] = float(any(o.leaked for o in kept))
    return dropped


def floor_self_of(states: Sequence[StateAudit]) -> dict[str, dict[str, float | None]]:
    """Per suite, B5 against itself under other seeds: the sampling floor."""
    from eu_audit.audits.embed import embedding_distance

    out: dict[str, dict[str, float | None]] = {}
    for suite in sorted({s.suite for s in states}):
        refs = [
            s for s in states if s.suite == suite and s.method == FLOOR and not s.error and s.floor_samples
        ]
        if refs:
            out[suite] = {
                "ngram": _mean([ngram_distance(r.samples, r.floor_samples) for r in refs]),
                "embed": _mean([embedding_distance(r.samples, r.floor_samples) for r in refs]),
                "tool_tv": _mean(
                    [
                        total_variation(tool_distribution(r.samples), tool_distribution(r.floor_samples))
                        for r in refs
                    ]
                ),
                "agreement": _mean([token_agreement(r.sample_ids, r.floor_sample_ids) for r in refs]),
            }
    return out


def cells_of(states: Sequence[StateAudit], methods: Sequence[str], margin: float, floor: bool) -> list[Cell]:
    suites = sorted({s.suite for s in states})
    return [_cell(m, suite, list(states), margin, floor) for m in methods for suite in [*suites, "all"]]


def _cell(method: str, suite: str, states: list[StateAudit], margin: float, with_floor: bool) -> Cell:
    def pick(m: str) -> list[StateAudit]:
        return [s for s in states if s.method == m and (suite == "all" or s.suite == suite)]

    mine = pick(method)
    ok = [s for s in mine if not s.error]
    floor_by = {s.session_id: s for s in pick(FLOOR) if not s.error} if with_floor else {}
    values: dict[str, float | None] = {}
    floor_vals: dict[str, float | None] = {}
    p: dict[str, float | None] = {}
    tost: dict[str, float | None] = {}
    unmeasured: dict[str, str] = {}
    for m in METRICS.in_order():
        values[m.name] = _mean([s.values.get(m.name) for s in ok])
        floor_vals[m.name] = _mean([s.values.get(m.name) for s in floor_by.values()])
        if values[m.name] is None:
            reasons = sorted({s.unmeasured[m.name] for s in ok if m.name in s.unmeasured})
            if reasons:
                unmeasured[m.name] = "; ".join(reasons)
        pairs = [
            (s.values.get(m.name), floor_by[s.session_id].values.get(m.name))
            for s in ok
            if s.session_id in floor_by
        ]
        pairs_f = [(a, b) for a, b in pairs if a is not None and b is not None]
        if method == FLOOR or not pairs_f:
            p[m.name], tost[m.name] = None, None
            continue
        xs, ys = [a for a, _ in pairs_f], [b for _, b in pairs_f]
        if m.binary:
            p[m.name] = mcnemar_exact([x > 0 for x in xs], [y > 0 for y in ys]).p
        else:
            p[m.name] = wilcoxon_paired(xs, ys)
        tost[m.name] = tost_paired(xs, ys, margin)
    return Cell(
        method=method,
        suite=suite,
        n=len(mine),
        errors=len(mine) - len(ok),
        values=values,
        floor=floor_vals,
        p=p,
        tost=tost,
        unmeasured=unmeasured,
    )


def audit_rows(report: AuditReport) -> list[dict[str, Any]]:
    """One flat row per state (session x method) with every metric, for analysis as a data set."""
    rows = []
    for st in report.states:
        row: dict[str, Any] = {
            "session_id": st.session_id,
            "episode_id": st.episode_id,
            "suite": st.suite,
            "method": st.method,
            "error": st.error or "",
        }
        for m in METRICS.in_order():
            v = st.values.get(m.name)
            row[m.name] = None if v is None else float(v)
        rows.append(row)
    return rows


def decided_again(
    base: AuditReport, states: list[StateAudit], rules: list[str], **update: Any
) -> AuditReport:
    """``base`` over ``states``, its figures decided again on them: the probes the floor drops, each
    method's cells and the gate (``rules``); ``update`` carries the other fields that changed (a merge's
    methods, bundles and cost; a re-score's matcher). One path for a merge of shards and a re-score."""
    from eu_audit.audits.gate import evaluate

    methods = update.get("methods", base.methods)
    new = base.model_copy(
        update={
            "states": states,
            "probes_dropped": drop_probes(states, base.probes),
            "cells": cells_of(states, methods, base.margin, base.floor),
            "own_floor": own_floor_checks(states, base.alpha),
            "gates": [],
            **update,
        }
    )
    if rules:
        new.gates = evaluate(new, rules)
    return new
