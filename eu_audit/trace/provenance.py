"""The artifact graph G: where a target entered (tau) and everything that depends on it (I(z)).

Edges are recorded data flow (parent -> child). The graph only ever grows, which is what makes the
taint closure monotone (Lemma 2 (i)). We do not attempt token-level attribution: a model turn's
parents are every block resident in its context, conservative but certifiable (Lemma 2 (ii)).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from eu_audit.errors import BadInput
from eu_audit.matching import contains_target
from eu_audit.trace.blocks import MODEL_DERIVED, BlockType, RuntimeBlock

#: Block types through which a target can *enter* a session (external observations).
ENTRY_TYPES = frozenset({BlockType.memory, BlockType.user, BlockType.tool_result, BlockType.system})


class ArtifactGraph:
    def __init__(self, blocks: Iterable[RuntimeBlock] = ()) -> None:
        self.blocks: dict[str, RuntimeBlock] = {}
        self.children: dict[str, list[str]] = {}
        for b in blocks:
            self.add(b)

    def add(self, block: RuntimeBlock) -> None:
        if block.id in self.blocks:
            raise ValueError(f"block id {block.id} added twice")
        for p in block.parents:
            if p not in self.blocks:
                raise ValueError(f"block {block.id} names unknown parent {p}")
        self.blocks[block.id] = block
        self.children[block.id] = []
        for p in block.parents:
            self.children[p].append(block.id)

    def __len__(self) -> int:
        return len(self.blocks)

    def entry_blocks(self, source: str) -> list[RuntimeBlock]:
        """Observation blocks through which ``source`` entered (carry it, are not model-derived)."""
        return [
            b
            for b in self.blocks.values()
            if source in b.source_ids and b.type not in MODEL_DERIVED and not b.derived
        ]

    def locate_source(self, target: str, variants: Iterable[str] = ()) -> str:
        """LocateSource(G, z): the source id of the earliest observation that contains ``target``."""
        for b in sorted(self.blocks.values(), key=lambda b: b.turn):
            if b.type in ENTRY_TYPES and not b.derived and contains_target(b.text, target, variants):
                return b.source_ids[0] if b.source_ids else b.id
        raise BadInput(f"target {target!r} does not occur in any observation of this session")

    def first_entry(self, source: str) -> int:
        """FirstEntry(G, s): tau, the first transition whose observation carries ``source``."""
        entries = self.entry_blocks(source)
        if not entries:
            if source in self.blocks:
                return self.blocks[source].turn
            raise BadInput(f"source {source!r} does not exist in this session")
        return min(b.turn for b in entries)

    def taint_closure(self, source: str) -> set[str]:
        """TaintClosure(G, s): the entry blocks and every block reachable from them, plus every block
        the oracle labelled with ``source`` (a turn generated while it was resident)."""
        seeds = [b.id for b in self.entry_blocks(source)]
        if not seeds and source in self.blocks:
            seeds = [source]
        if not seeds:
            raise BadInput(f"source {source!r} does not exist in this session")
        seen: set[str] = set()
        queue = deque(seeds)
        while queue:
            bid = queue.popleft()
            if bid in seen:
                continue
            seen.add(bid)
            queue.extend(self.children[bid])
        seen.update(b.id for b in self.blocks.values() if source in b.source_ids)
        return seen
