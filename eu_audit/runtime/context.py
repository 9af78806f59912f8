"""The session's context as provenance sees it: every artifact recorded as a RuntimeBlock, the artifact
graph they form, and which blocks are resident in the KV cache (the manifest), in order.

Adding a resident block prefills its ids as one segment (the canonical schedule); a block that lives
outside the cache (a tool call record, a memory write-back) is recorded without touching the engine.
"""

from __future__ import annotations

from collections.abc import Sequence

from eu_audit.engines import KVEngine
from eu_audit.trace.blocks import BlockType, RuntimeBlock
from eu_audit.trace.provenance import ArtifactGraph


class Context:
    def __init__(self, engine: KVEngine) -> None:
        self.engine = engine
        self.blocks: list[RuntimeBlock] = []
        self.graph = ArtifactGraph()
        self.manifest: list[str] = []  # ids of the blocks resident in the cache, in order
        self.start_manifest: list[str] = []  # R_init: what a compaction keeps
        self.start_offset = 0
        self.t = 0  # the transition being recorded

    def add(
        self,
        btype: BlockType,
        *,
        text: str = "",
        ids: Sequence[int] = (),
        parents: Sequence[str] = (),
        sources: Sequence[str] = (),
        resident: bool = True,
        derived: bool = False,
        committed: bool = False,
        independent: bool = False,
        already_in_cache: bool = False,
    ) -> RuntimeBlock:
        """Record a block; when ``resident`` its ids are prefilled as one segment (unless the engine
        already committed them, as after a decoded turn)."""
        span = None
        if resident:
            start = self.engine.offset - (len(ids) if already_in_cache else 0)
            if not already_in_cache:
                self.engine.prefill(ids)
            span = (start, start + len(ids))
        block = RuntimeBlock(
            id=f"b{len(self.blocks)}",
            type=btype,
            parents=list(parents),
            source_ids=sorted(set(sources)),
            token_span=span,
            turn=self.t,
            committed=committed,
            derived=derived,
            independent=independent,
            text=text,
            token_ids=list(ids) if resident else [],
        )
        self.blocks.append(block)
        self.graph.add(block)
        if resident:
            self.manifest.append(block.id)
        return block

    def resident_sources(self) -> list[str]:
        """Oracle propagation: every source id resident in the context right now."""
        found: set[str] = set()
        for bid in self.manifest:
            found.update(self.graph.blocks[bid].source_ids)
        return sorted(found)

    def last(self) -> RuntimeBlock:
        """The block resident last (the observation a turn answers)."""
        return self.graph.blocks[self.manifest[-1]]

    def mark_start(self) -> None:
        """What is resident now is R_init: a compaction comes back to it."""
        self.start_manifest = list(self.manifest)
        self.start_offset = self.engine.offset

    def back_to_start(self) -> None:
        """Compaction: keep R_init by a crop, drop everything after it from the cache."""
        self.engine.crop(self.start_offset)
        self.manifest = list(self.start_manifest)

    def adopt(self, blocks: Sequence[RuntimeBlock], manifest: Sequence[str], t: int) -> None:
        """Take over recorded blocks (a restore): the cache already holds ``manifest``."""
        self.blocks = [b.model_copy(deep=True) for b in blocks]
        self.graph = ArtifactGraph(self.blocks)
        self.manifest = list(manifest)
        self.start_manifest = [b.id for b in self.blocks if b.turn == 0 and b.token_span is not None]
        start = set(self.start_manifest)
        self.start_offset = sum(len(b.token_ids) for b in self.blocks if b.id in start)
        self.t = t
