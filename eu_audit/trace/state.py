"""Bringing a recorded state back to life in an engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from eu_audit.checkpoints import common_prefix
from eu_audit.errors import BadInput

if TYPE_CHECKING:
    from eu_audit.engines import KVEngine
    from eu_audit.trace.session import SessionTrace


def rebuild_state(engine: KVEngine, trace: SessionTrace) -> None:
    """Rebuild a session's final cache from its recorded token ids (exact under the canonical
    schedule), then apply any recorded excision: how every bundle state is brought back to life."""
    StateBuilder(engine).rebuild(trace)


def _excise(engine: KVEngine, trace: SessionTrace) -> None:
    if trace.session.kv_excised:
        if not engine.abilities.excise:
            raise BadInput(
                f"session {trace.session_id} was excised from KV tensors; engine '{engine.name}' "
                "holds none (use --engine hf)"
            )
        engine.excise(trace.session.kv_excised)


def segments(trace: SessionTrace) -> list[tuple[int, ...]]:
    """The state's segments in cache order: each one was one forward pass when it was recorded."""
    blocks = {b.id: b for b in trace.blocks}
    return [tuple(blocks[b].token_ids) for b in trace.session.final_manifest]


class StateBuilder:
    """Rebuilds states one after another in one engine, keeping the longest run of leading segments
    the next state shares with what the engine holds (the same token ids, segment for segment).

    Every state of one session shares the segments before tau, whatever the method; cropping back to a
    segment start and prefilling the rest is bitwise a fresh rebuild under the canonical schedule
    (Lemma 1; measured on both local engines, tests/test_llamacpp.py), so this only saves compute.
    Matching is by segment, not by token: the same ids prefilled in other chunks give other KV values.
    """

    def __init__(self, engine: KVEngine) -> None:
        self.engine = engine
        self.resident: list[tuple[int, ...]] = []  # what the engine holds, segment by segment

    def rebuild(self, trace: SessionTrace) -> int:
        """Bring ``trace``'s final state into the engine; returns how many tokens were kept."""
        target = segments(trace)
        held = sum(len(s) for s in self.resident)
        keep = common_prefix(self.resident, target) if held == self.engine.offset else 0
        kept = sum(len(s) for s in target[:keep])
        if keep == 0:
            self.engine.reset()
        else:
            self.engine.crop(kept)
        self.resident = []  # until the state is whole: a failure part-way leaves nothing to reuse
        for seg in target[keep:]:
            self.engine.prefill(seg)
        self.resident = target
        if trace.session.kv_excised:
            _excise(self.engine, trace)
            self.resident = []  # edited in place: nothing it holds is a prefix of another state
        return kept

    def extend(self, ids: Sequence[int]) -> None:
        """Prefill one more segment on top of the state (e.g. the memory records surfaced once)."""
        if ids:
            held = sum(len(s) for s in self.resident)
            self.engine.prefill(ids)
            if held + len(ids) == self.engine.offset:  # not on top of an excised state
                self.resident.append(tuple(ids))
