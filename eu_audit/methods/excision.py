"""Span-only excision (the invalidation-boundary ablation): keep the suffix KV, cut the target's
positions out of the cache. Everything computed while attending to the target stays. It edits KV
tensors, so it runs on the ``hf`` engine only."""

from __future__ import annotations

from typing import Any

from eu_audit.matching import TargetMatcher
from eu_audit.methods.base import ForgetContext, MethodResult, method, post_trace, usable_matcher
from eu_audit.trace.provenance import ArtifactGraph


def token_ranges(tokenizer: Any, ids: list[int], matcher: TargetMatcher) -> list[tuple[int, int]]:
    """Token index ranges (within ``ids``) whose text overlaps a match of the target."""
    pieces = [tokenizer.decode([i], skip_special_tokens=False) for i in ids]
    starts, pos = [], 0
    for p in pieces:
        starts.append(pos)
        pos += len(p)
    text = "".join(pieces)
    out = []
    for a, b in matcher.spans(text):
        toks = [i for i, s in enumerate(starts) if s < b and s + len(pieces[i]) > a]
        if toks:
            out.append((toks[0], toks[-1] + 1))
    return out


@method(
    "excise",
    "span-only excision: drop the target's token positions from the cache, keep the rest",
    place=10,
    needs=("excise",),
)
def span_only_excision(ctx: ForgetContext) -> MethodResult:
    matcher = usable_matcher(ctx)
    entries = {b.id for b in ArtifactGraph(ctx.trace.blocks).entry_blocks(ctx.source)}
    ranges: list[tuple[int, int]] = []
    blocks = []
    for b in ctx.trace.blocks:
        if b.id in entries and b.id in ctx.trace.session.final_manifest and b.token_span is not None:
            local = token_ranges(ctx.engine.tokenizer, b.token_ids, matcher)
            ranges += [(b.token_span[0] + s, b.token_span[0] + e) for s, e in local]
            b = b.model_copy(update={"text": matcher.redact(b.text, "")})
        blocks.append(b)
    ctx.engine.excise(ranges)  # an engine with the "excise" ability (checked before any compute)
    trace = post_trace(ctx, blocks=blocks, manifest=ctx.trace.session.final_manifest, kv_excised=ranges)
    return MethodResult(trace, transitions=0)
