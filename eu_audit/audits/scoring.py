"""One scoring path for both sides. A white-box audit asks its probes of a rebuilt cache; a black-box one
reads what the agent answered in the run; both hand the same ``Evidence`` to ``score``, and every metric
computes its value from it with the computation it carries (``Metric.compute``). Metrics relative to the
floor (CAD, agreement, distances) take the state and its B5 reference (``Metric.against_floor``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from eu_audit.audits.leakage import ArtifactLeak
from eu_audit.audits.metric import METRICS, Side
from eu_audit.audits.model import ProbeOutcome, StateAudit
from eu_audit.matching import TargetMatcher
from eu_audit.trace.records import ResidueRecord
from eu_audit.trace.session import SessionTrace


class NotMeasured(str):
    """A metric that applies to the state but could not be measured: the reason, in words. The state
    then has no value for it, and the reason is listed (never a pass)."""


@dataclass
class Evidence:
    """What was asked of one state and what it answered, plus what the state itself holds."""

    side: Side  # white: asked of a rebuilt cache; black: what a deployed agent answered in its run
    trace: SessionTrace
    matcher: TargetMatcher
    artifacts: ArtifactLeak
    probes: list[ProbeOutcome] = field(default_factory=list)
    samples: list[str] = field(default_factory=list)
    choices: list[str | None] = field(default_factory=list)
    residue: ResidueRecord | None = None  # the black-box residue record (serve log, store dump)

    @property
    def excluded(self) -> str | None:
        """The option a preference episode's revoked reason argues against (None off that suite)."""
        value = self.trace.session.episode.meta.get("excluded")
        return str(value) if value else None


@dataclass
class FloorPair:
    """A state and its B5 reference of the same session."""

    state: StateAudit
    floor: StateAudit
    trace: SessionTrace
    floor_trace: SessionTrace


def score(st: StateAudit, ev: Evidence) -> None:
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
