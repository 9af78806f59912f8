"""Sanitized replay (Algorithm 1, lines 4-10): restore a clean boundary, re-enact the suffix.

Sanitize: the agent runs in the counterfactual world, so the observation at tau is o_tau without z and
every other observation is the recorded one (A2). ReplayTools: read-only tools re-run on the restored
environment snapshot; consequential tools are shadow-executed and deduplicated by call id, so a real
side effect never fires twice (A3). Content fixed in the counterfactual world, the recorded turns of
structurally independent sub-tasks, is re-prefilled instead of re-decoded (the agent is handed them at
construction: ``ReplayInputs.fixed_turns``).
"""

from __future__ import annotations

from dataclasses import dataclass

from eu_audit.checkpoints import Checkpoint
from eu_audit.runtime.agent import Agent
from eu_audit.trace.blocks import MODEL_DERIVED
from eu_audit.trace.session import SessionTrace


@dataclass
class ReplayStats:
    transitions: int  # invocations of F (transitions re-enacted)
    reused_turns: int  # independent turns re-materialised by prefill
    rebuilt_tokens: int  # recorded clean-prefix tokens re-prefilled during the restore


def recorded_fixed_turns(trace: SessionTrace) -> dict[int, tuple[list[int], list[int]]]:
    """t -> (observation ids, turn ids) for every recorded independent turn."""
    blocks = {b.id: b for b in trace.blocks}
    out: dict[int, tuple[list[int], list[int]]] = {}
    for obs in trace.observations:
        turn = next(
            (
                b
                for b in trace.blocks
                if b.turn == obs.t and b.independent and b.type in MODEL_DERIVED and obs.block_id in b.parents
            ),
            None,
        )
        if turn is not None:
            out[obs.t] = (blocks[obs.block_id].token_ids, turn.token_ids)
    return out


def replay_suffix(
    agent: Agent,
    trace: SessionTrace,
    checkpoint: Checkpoint,
    boundary: int,
    *,
    held: list[str],
) -> ReplayStats:
    """Resume ``agent`` at R_boundary (restored from ``checkpoint``) and re-enact transitions
    boundary+1..T of the episode in the agent's world."""
    rebuilt = agent.resume(trace, checkpoint, boundary=boundary, held=held)
    steps = agent.episode.steps[boundary:]
    for step in steps:
        agent.step(step)
    return ReplayStats(transitions=len(steps), reused_turns=agent.fixed_reused, rebuilt_tokens=rebuilt)
