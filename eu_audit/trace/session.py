"""A recorded session as the domain sees it, independent of the file it came from.

``SessionTrace`` is everything known about one session (its records, the provenance graph they form,
where the target entered); ``Bundle`` is a header plus sessions. ``eu_audit.bundle`` reads and writes
them; the runtime, methods and audits work on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

from eu_audit.checkpoints import Checkpoint
from eu_audit.errors import BadInput
from eu_audit.matching import TargetMatcher
from eu_audit.trace.blocks import RuntimeBlock
from eu_audit.trace.provenance import ArtifactGraph
from eu_audit.trace.records import (
    AgentForgetRecord,
    BlockRecord,
    CheckpointRecord,
    ElicitationRecord,
    ForgetRequestRecord,
    Header,
    LedgerRecord,
    ObservationRecord,
    ReceiptRecord,
    ResidueRecord,
    SessionRecord,
    ToolCallRecord,
)


@dataclass
class SessionTrace:
    """Everything a recording holds about one session."""

    session: SessionRecord
    observations: list[ObservationRecord] = field(default_factory=list)
    blocks: list[RuntimeBlock] = field(default_factory=list)
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    forget_requests: list[ForgetRequestRecord] = field(default_factory=list)
    ledgers: list[LedgerRecord] = field(default_factory=list)
    receipts: list[ReceiptRecord] = field(default_factory=list)
    # a black-box run's own records (empty for sessions eu-audit's runtime ran)
    elicitations: list[ElicitationRecord] = field(default_factory=list)
    residues: list[ResidueRecord] = field(default_factory=list)
    agent_forgets: list[AgentForgetRecord] = field(default_factory=list)

    @property
    def session_id(self) -> str:
        return self.session.session_id

    def graph(self) -> ArtifactGraph:
        return ArtifactGraph(self.blocks)

    def block(self, block_id: str) -> RuntimeBlock:
        for b in self.blocks:
            if b.id == block_id:
                return b
        raise KeyError(block_id)

    def matcher(self) -> TargetMatcher:
        return self.session.target.matcher()

    def tau(self) -> int | None:
        """Where the target entered, or None when no block carries its source (a post-forget state
        that dropped it, a counterfactual run)."""
        g = self.graph()
        src = self.session.source_id
        return g.first_entry(src) if g.entry_blocks(src) else None

    def closure(self) -> set[str]:
        g = self.graph()
        src = self.session.source_id
        return g.taint_closure(src) if g.entry_blocks(src) else set()

    def target_occurrences(self) -> list[RuntimeBlock]:
        """Blocks whose text holds the session's target (any variant the matcher knows)."""
        m = self.matcher()
        return [b for b in self.blocks if m.found_in(b.text)]

    def records(self) -> list[BaseModel]:
        sid = self.session_id
        out: list[BaseModel] = [self.session, *self.observations]
        out += [BlockRecord(session_id=sid, block=b) for b in self.blocks]
        out += self.tool_calls
        out += [CheckpointRecord(session_id=sid, checkpoint=c) for c in self.checkpoints]
        out += self.forget_requests
        out += self.ledgers
        out += self.receipts
        out += self.elicitations
        out += self.residues
        out += self.agent_forgets
        return out


@dataclass
class Bundle:
    header: Header
    sessions: list[SessionTrace]
    path: Path | None = None
    digest: str | None = None  # sha256 of the file it was read from
    #: (session id, record kind, key) -> the line it was read from, so a check can name it
    lines: dict[tuple[str, str, str], int] = field(default_factory=dict)

    def session(self, session_id: str) -> SessionTrace:
        for s in self.sessions:
            if s.session_id == session_id:
                return s
        raise BadInput(f"no session '{session_id}' in the bundle")

    def records(self) -> list[BaseModel]:
        out: list[BaseModel] = [self.header]
        for s in self.sessions:
            out += s.records()
        return out
