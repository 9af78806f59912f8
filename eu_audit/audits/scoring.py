"""One scoring path for both sides. A white-box audit asks its probes of a rebuilt cache; a black-box one
reads what the agent answered in the run; both hand the same ``StateEvidence`` to ``score``, and every metric
computes its value from it with the computation it carries (``Metric.compute``). Metrics relative to the
floor (CAD, agreement, distances) take the state and its B5 reference (``Metric.against_floor``)."""

from __future__ import annotations

from eu_audit.audits.metric import METRICS
from eu_audit.audits.model import StateAudit
from eu_audit.audits.state_evidence import FloorPair, NotMeasured, StateEvidence


def score(st: StateAudit, ev: StateEvidence) -> None:
    """Every metric measurable on this side, from the evidence: its value, or why it has none."""
    for m in METRICS.in_order():
        if m.compute is None or ev.side not in m.sides:
            continue
        value = m.compute(ev)
        if isinstance(value, NotMeasured):
            st.unmeasured[m.name] = str(value)
        else:
            st.values[m.name] = value


def score_against_floor(pair: FloorPair) -> None:
    """Every metric measured against the floor's state of the same session."""
    for m in METRICS.in_order():
        if m.against_floor is None:
            continue
        value = m.against_floor(pair)
        if isinstance(value, NotMeasured):
            pair.state.values[m.name] = None
            pair.state.unmeasured[m.name] = str(value)
        else:
            pair.state.values[m.name] = value


def without_floor(st: StateAudit) -> None:
    """No B5 state for this session: every metric relative to the floor is left unmeasured, saying so."""
    for m in METRICS.in_order():
        if m.against_floor is not None:
            st.values.pop(m.name, None)
            st.unmeasured[m.name] = "not measured: no B5 floor state for this session"
