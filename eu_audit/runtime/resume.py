"""Restore: continue a recorded session at a clean boundary (Algorithm 1, line 5, and Lemma 1).

The cache keeps, by one crop, what it shares with the checkpoint's manifest (cropping is restoring);
recorded blocks still missing up to the boundary (the checkpoint's remainder, blocks a compaction
dropped, clean transitions between the checkpoint and the boundary) are prefilled from their recorded
token ids, which is exact under the canonical schedule and invokes no model turn. The agent adopts the
recorded artifacts of transitions 1..boundary and rebuilds the environment and the memory store as they
stood at that point (identical in both worlds before tau, Lemma 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from eu_audit.checkpoints import Checkpoint, CheckpointReason, common_prefix, manifest_at
from eu_audit.episodes import StepKind
from eu_audit.errors import RunFailed
from eu_audit.runtime.memory import WRITE_BACK_PREFIX
from eu_audit.runtime.world import env_snapshot_id
from eu_audit.trace.blocks import BlockType

if TYPE_CHECKING:
    from eu_audit.checkpoints import CheckpointStore
    from eu_audit.engines import KVEngine
    from eu_audit.episodes import Episode
    from eu_audit.runtime.context import Context
    from eu_audit.runtime.dispatch import ToolDispatcher
    from eu_audit.runtime.memory import MemoryStore
    from eu_audit.runtime.world import WorldView
    from eu_audit.trace.blocks import RuntimeBlock
    from eu_audit.trace.records import ObservationRecord, ToolCallRecord
    from eu_audit.trace.session import SessionTrace


class Resumable(Protocol):
    """What a restore reads and sets on the agent (``eu_audit.runtime.agent.Agent`` is one): named here,
    so this module depends on the agent's parts and never on the agent, which calls it."""

    sid: str
    engine: KVEngine
    episode: Episode
    env: dict[str, Any]
    view: WorldView
    context: Context
    memory: MemoryStore
    dispatch: ToolDispatcher
    checkpoints: CheckpointStore
    observations: list[ObservationRecord]
    tool_calls: list[ToolCallRecord]
    pending_results: list[tuple[str, Any]]

    @property
    def blocks(self) -> list[RuntimeBlock]: ...


def resume(
    agent: Resumable,
    trace: SessionTrace,
    checkpoint: Checkpoint,
    boundary: int | None = None,
    held: Sequence[str] | None = None,
) -> int:
    """Bring ``agent`` to R_boundary of ``trace`` (default: the checkpoint's own boundary). ``held`` is the
    manifest the engine's cache holds now (default: the agent's own). Returns the tokens re-prefilled."""
    boundary = checkpoint.boundary if boundary is None else boundary
    if boundary < checkpoint.boundary:
        raise ValueError(f"cannot resume at {boundary} from a later checkpoint ({checkpoint.boundary})")
    prefilled = _restore_cache(agent, trace, checkpoint, boundary, held)
    _adopt_record(agent, trace, boundary)
    _restore_environment(agent, trace, checkpoint, boundary)
    _seed_memory(agent, boundary)
    agent.checkpoints.items = [c for c in trace.checkpoints if c.boundary <= boundary]
    return prefilled


def _restore_cache(
    agent: Resumable, trace: SessionTrace, checkpoint: Checkpoint, boundary: int, held: Sequence[str] | None
) -> int:
    recorded = {b.id: b for b in trace.blocks}
    missing = [b for b in checkpoint.manifest if b not in recorded]
    if missing:
        raise RunFailed(f"checkpoint {checkpoint.id} names block {missing[0]} that the trace lacks")
    target = manifest_at(trace.blocks, boundary)
    held = list(agent.context.manifest if held is None else held)
    keep = min(common_prefix(held, checkpoint.manifest), common_prefix(checkpoint.manifest, target))
    engine = agent.engine
    if not held:
        engine.reset()
    engine.crop(sum(len(recorded[b].token_ids) for b in held[:keep]))
    before = engine.account.prefilled
    for bid in target[keep:]:
        engine.prefill(recorded[bid].token_ids)
    return engine.account.prefilled - before


def _adopt_record(agent: Resumable, trace: SessionTrace, boundary: int) -> None:
    """The recorded artifacts of transitions 1..boundary become the agent's own."""
    agent.context.adopt(
        [b for b in trace.blocks if b.turn <= boundary], manifest_at(trace.blocks, boundary), boundary
    )
    calls = [c for c in trace.tool_calls if c.turn <= boundary]
    agent.tool_calls = [c.model_copy(deep=True) for c in calls]
    agent.observations = [o for o in trace.observations if o.t <= boundary]
    agent.pending_results = [
        (c.block_id, c.result)
        for c in calls
        if c.turn == boundary and c.status in ("executed", "shadowed") and c.raw
    ]


def _restore_environment(
    agent: Resumable, trace: SessionTrace, checkpoint: Checkpoint, boundary: int
) -> None:
    """The world's initial environment plus the committed effects up to the boundary (identical in both
    worlds before tau). Only the factual world has a recorded snapshot to match."""
    agent.env = agent.view.environment()
    agent.dispatch.apply_committed(agent.env, [c for c in trace.tool_calls if c.turn <= boundary])
    # Empty for handles not taken during the recording; a before_consequential snapshot predates its
    # transition's side effect, while R_boundary includes it: nothing to compare then.
    recorded_env = checkpoint.env_snapshot_id
    if CheckpointReason.before_consequential in checkpoint.reasons:
        recorded_env = ""
    if (
        recorded_env
        and agent.view.factual
        and boundary == checkpoint.boundary
        and env_snapshot_id(agent.env) != recorded_env
    ):
        raise RunFailed(
            f"environment at checkpoint {checkpoint.id} cannot be reproduced (its snapshot id differs)"
        )


def _seed_memory(agent: Resumable, boundary: int) -> None:
    """The persistent store as it stood after transition ``boundary``."""
    for item in agent.episode.memory:
        agent.memory.add(agent.sid, item.id, item.text, [])
    for t, step in enumerate(agent.episode.steps[:boundary], 1):
        if step.kind is StepKind.memory:
            agent.memory.add(agent.sid, *agent.view.memory_record(step, t))
    for b in agent.blocks:
        if b.type is BlockType.memory and b.derived and b.token_span is None:
            agent.memory.add(agent.sid, f"{WRITE_BACK_PREFIX}{b.turn}", b.text, b.source_ids)
