"""Serving-layer residue: after a forget, does the server's prefix cache still hold KV computed from the
target? (Only a served engine has a serving layer; the local engines hold one cache, which the methods
themselves crop.)

The oracle, per session: ``P_z`` is the recorded prompt prefix that carried z (the context up to the end
of the observation at tau), ``P_d`` the same prefix with z's tokens swapped for a decoy of the same token
length. Send ``P_z`` once, then ``P_d`` once (one output token each: the first probe pollutes the cache,
so only one-shot measurements count), and compare the tokens the server says it reused:

    residual_cached_tokens = max(0, cached(P_z) - cached(P_d))

0 means the server serves nothing of z that it would not serve for the decoy. (``P_z`` goes first, so
the decoy's reading includes the clean prefix ``P_z`` just left behind: on a clean server the
difference is at most 0, and the clamp keeps that pollution from reading as a negative residue.)
Then the server's own reset is called (llama.cpp slot erase, vLLM ``/reset_prefix_cache``, SGLang
``/flush_cache``) and the oracle runs again: ``reset_effective`` is 1 when the residual is 0 after it.
"""

from __future__ import annotations

from dataclasses import dataclass

from eu_audit.checkpoints import manifest_at
from eu_audit.engines.served import OpenAIEngine
from eu_audit.errors import BadInput
from eu_audit.methods.excision import token_ranges
from eu_audit.trace.session import SessionTrace


@dataclass(frozen=True)
class ServingResidue:
    session_id: str
    prefix_tokens: int  # len(P_z)
    clean_prefix: int  # tokens before the first token of z
    residual_cached_tokens: int | None  # None: the server does not report cached tokens
    residual_after_reset: int | None
    reset_call: str

    @property
    def reset_effective(self) -> float | None:
        return None if self.residual_after_reset is None else float(self.residual_after_reset == 0)


def carrying_prefix(trace: SessionTrace, decoy_id: int) -> tuple[list[int], list[int], int]:
    """(P_z, P_d, index of z's first token) from a recorded session (one that still holds the entry
    block of its target)."""
    g = trace.graph()
    entries = g.entry_blocks(trace.session.source_id)
    if not entries:
        raise BadInput(f"session {trace.session_id} no longer holds the observation that carried its target")
    entry = min(entries, key=lambda b: b.turn)
    manifest = manifest_at(trace.blocks, entry.turn)
    if entry.id not in manifest:
        raise BadInput(f"session {trace.session_id}: the carrying observation is not in the cache timeline")
    blocks = {b.id: b for b in trace.blocks}
    prefix: list[int] = []
    for bid in manifest[: manifest.index(entry.id)]:
        prefix += blocks[bid].token_ids
    return prefix, entry.token_ids, len(prefix)


def measure(engine: OpenAIEngine, trace: SessionTrace) -> ServingResidue:
    tok = engine.tokenizer
    decoy = int(tok("x", add_special_tokens=False)["input_ids"][-1])
    prefix, entry_ids, start = carrying_prefix(trace, decoy)
    ranges = token_ranges(tok, entry_ids, trace.matcher())
    if not ranges:
        raise BadInput(f"session {trace.session_id}: the target is not in its carrying observation's tokens")
    decoyed = list(entry_ids)
    for a, b in ranges:
        decoyed[a:b] = [decoy] * (b - a)
    p_z, p_d = prefix + list(entry_ids), prefix + decoyed

    def residual() -> int | None:
        cz = engine.cached_tokens_for(p_z)
        cd = engine.cached_tokens_for(p_d)
        return None if cz is None or cd is None else max(0, cz - cd)

    before = residual()
    call = engine.reset_cache()
    after = residual()
    engine.reset_cache()  # leave nothing of z behind in the server after the measurement itself
    return ServingResidue(trace.session_id, len(p_z), start + ranges[0][0], before, after, call)
