"""Metadata-only checkpoints: restoring one is a crop (Lemma 1), no tensor is ever copied.

A checkpoint names the state R_t after transition ``boundary`` by its token offset, the engine cache
handle, the environment snapshot and the prompt manifest (the ids of the blocks resident in the cache,
in order). The manifest is what makes restore exact even after a compaction rewrote the context: the
longest resident prefix is kept by a crop and any missing recorded blocks are prefilled again.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from enum import StrEnum
from typing import Protocol

from pydantic import BaseModel, ConfigDict


class CheckpointReason(StrEnum):
    session_start = "session_start"
    turn = "turn"
    before_memory = "before_memory"
    before_consequential = "before_consequential"
    before_compaction = "before_compaction"


class CheckpointPolicy(StrEnum):
    """Granularity is an efficiency knob, not a correctness one (replay from any earlier clean
    boundary is equally exact, only longer)."""

    every_turn = "every_turn"
    semantic = "semantic"
    session_start = "session_start"

    def admits(self, reasons: set[CheckpointReason]) -> bool:
        if self is CheckpointPolicy.every_turn:
            return True
        if self is CheckpointPolicy.session_start:
            return CheckpointReason.session_start in reasons
        return bool(reasons - {CheckpointReason.turn})


class Checkpoint(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    boundary: int  # the state R_boundary (after transition ``boundary``; 0 = session start)
    reasons: list[CheckpointReason]
    token_offset: int
    cache_handle: str
    env_snapshot_id: str
    manifest: list[str]

    def nbytes(self) -> int:
        """Metadata size: what this checkpoint costs to keep."""
        return len(self.model_dump_json().encode())


class CheckpointStore:
    def __init__(
        self, policy: CheckpointPolicy = CheckpointPolicy.every_turn, handle_prefix: str = ""
    ) -> None:
        self.policy = policy
        self.handle_prefix = handle_prefix
        self.items: list[Checkpoint] = []

    def register(
        self,
        *,
        boundary: int,
        reasons: set[CheckpointReason],
        token_offset: int,
        env_snapshot_id: str,
        manifest: list[str],
    ) -> Checkpoint | None:
        if not self.policy.admits(reasons):
            return None
        cp = Checkpoint(
            id=f"c{len(self.items)}",
            boundary=boundary,
            reasons=sorted(reasons),
            token_offset=token_offset,
            cache_handle=f"{self.handle_prefix}@{token_offset}",
            env_snapshot_id=env_snapshot_id,
            manifest=list(manifest),
        )
        self.items.append(cp)
        return cp

    def latest_before(self, tau: int) -> Checkpoint:
        """c* = argmax{c in C : boundary(c) < tau} (Algorithm 1, line 4); ties go to the later one."""
        eligible = [c for c in self.items if c.boundary < tau]
        if not eligible:
            raise LookupError(f"no checkpoint before transition {tau}")
        return max(eligible, key=lambda c: (c.boundary, self.items.index(c)))

    def total_bytes(self) -> int:
        return sum(c.nbytes() for c in self.items)


class _Engine(Protocol):
    def crop(self, offset: int) -> None: ...
    def prefill(self, ids: Sequence[int]) -> None: ...


class _HasIds(Protocol):
    @property
    def token_ids(self) -> list[int]: ...


def common_prefix(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class _Spanned(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def turn(self) -> int: ...
    @property
    def token_span(self) -> tuple[int, int] | None: ...


def manifest_at(blocks: Sequence[_Spanned], boundary: int) -> list[str]:
    """The blocks resident in the cache after transition ``boundary``, derived from the recorded
    token spans: a block that starts before the end of the resident context means the context was
    rewritten there (a compaction cropped it), so the blocks beyond that point left the cache."""
    resident: list[_Spanned] = []
    for b in blocks:
        if b.turn > boundary or b.token_span is None:
            continue
        start = b.token_span[0]
        while resident and resident[-1].token_span is not None and resident[-1].token_span[1] > start:
            resident.pop()
        resident.append(b)
    return [b.id for b in resident]


def restore(
    engine: _Engine, current: Sequence[str], target: Sequence[str], blocks: Mapping[str, _HasIds]
) -> int:
    """Bring the cache from manifest ``current`` to manifest ``target``: keep the longest shared prefix
    by a crop (Lemma 1: cropping is restoring), prefill any recorded blocks still missing (after a
    compaction the clean prefix may no longer be resident). Returns the number of blocks re-prefilled."""
    keep = common_prefix(current, target)
    engine.crop(sum(len(blocks[b].token_ids) for b in current[:keep]))
    for bid in target[keep:]:
        engine.prefill(blocks[bid].token_ids)
    return len(target) - keep
