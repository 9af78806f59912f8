"""What one state gave the audit, the same on both sides: what it was asked and answered, what it holds
(``StateEvidence``), a state and its B5 reference (``FloorPair``), and a value that could not be measured
(``NotMeasured``). The metrics' computations take these (``Metric.compute``); they import no metric, so the
metric registry can name them without a cycle."""

from __future__ import annotations

from dataclasses import dataclass, field

from eu_audit.audits.leakage import ArtifactLeak
from eu_audit.audits.model import ProbeOutcome, StateAudit
from eu_audit.matching import TargetMatcher
from eu_audit.trace.records import ResidueRecord, Side
from eu_audit.trace.session import SessionTrace


class NotMeasured(str):
    """A metric that applies to the state but could not be measured: the reason, in words. The state
    then has no value for it, and the reason is listed (never a pass)."""


@dataclass
class StateEvidence:
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
