"""Span-only excision (the invalidation-boundary ablation): keep the suffix KV, cut the target's
positions out of the cache. Everything computed while attending to the target stays."""

from __future__ import annotations

from eu_audit.methods.base import ForgetContext, Meter, MethodResult, method, post_trace, target_pattern
from eu_audit.provenance import ArtifactGraph


def token_ranges(tokenizer: object, ids: list[int], pattern: object) -> list[tuple[int, int]]:
    """Token index ranges (within ``ids``) whose text overlaps a match of ``pattern``."""
    pieces = [tokenizer.decode([i], skip_special_tokens=False) for i in ids]  # type: ignore[attr-defined]
    starts, pos = [], 0
    for p in pieces:
        starts.append(pos)
        pos += len(p)
    text = "".join(pieces)
    out = []
    for m in pattern.finditer(text):  # type: ignore[attr-defined]
        toks = [i for i, s in enumerate(starts) if s < m.end() and s + len(pieces[i]) > m.start()]
        if toks:
            out.append((toks[0], toks[-1] + 1))
    return out


@method("excise", "span-only excision: drop the target's token positions from the cache, keep the rest")
def span_only_excision(ctx: ForgetContext) -> MethodResult:
    meter = Meter(ctx)
    pat = target_pattern(ctx.variants)
    entries = {b.id for b in ArtifactGraph(ctx.trace.blocks).entry_blocks(ctx.source)}
    ranges: list[tuple[int, int]] = []
    blocks = []
    for b in ctx.trace.blocks:
        if b.id in entries and b.id in ctx.trace.session.final_manifest and b.token_span is not None:
            local = token_ranges(ctx.loaded.tokenizer, b.token_ids, pat)
            ranges += [(b.token_span[0] + s, b.token_span[0] + e) for s, e in local]
            b = b.model_copy(update={"text": pat.sub("", b.text)})
        blocks.append(b)
    ctx.engine.excise(ranges)
    trace = post_trace(
        ctx, "excise", blocks=blocks, manifest=ctx.trace.session.final_manifest, kv_excised=ranges
    )
    return MethodResult(trace, meter.ledger("excise", 0))
