"""The baselines of the paper's Methods paragraph: what deployed stacks and simple fixes do."""

from __future__ import annotations

import json

from eu_audit.episodes import Phase, Step, StepKind
from eu_audit.methods.base import (
    ForgetContext,
    MethodResult,
    materialise,
    method,
    post_trace,
    usable_matcher,
)
from eu_audit.trace.provenance import ArtifactGraph
from eu_audit.trace.records import MemoryEntry

REDACTED = "[REDACTED]"
FORGET_INSTRUCTION = "Forget this and never mention or use it again: {z}"


@method("b0", "no forget (the contaminated state as is)", place=0)
def no_forget(ctx: ForgetContext) -> MethodResult:
    trace = post_trace(ctx, blocks=ctx.trace.blocks, manifest=ctx.trace.session.final_manifest)
    return MethodResult(trace, transitions=0)


def _is_source_record(entry: MemoryEntry, source: str) -> bool:
    """The persistent record the source observation stored (not a write-back the model derived)."""
    return source in entry.source_ids and not entry.derived


@method(
    "b1", "memory delete: remove the persistent record, session untouched (what deployed stacks do)", place=1
)
def memory_delete(ctx: ForgetContext) -> MethodResult:
    memory = [m for m in ctx.trace.session.memory_final if not _is_source_record(m, ctx.source)]
    trace = post_trace(ctx, blocks=ctx.trace.blocks, manifest=ctx.trace.session.final_manifest, memory=memory)
    return MethodResult(trace, transitions=0)


@method("b2", "forget instruction: append an instruction to forget z (one more transition)", place=2)
def forget_instruction(ctx: ForgetContext) -> MethodResult:
    agent = ctx.new_agent(world="factual", shadow=True)
    agent.resume(ctx.trace, ctx.checkpoint_at(ctx.T), held=ctx.trace.session.final_manifest)
    agent.step(
        Step(kind=StepKind.user, phase=Phase.further, content=FORGET_INSTRUCTION.format(z=ctx.request.target))
    )
    after = agent.trace()
    after.session = after.session.model_copy(update={"memory_final": ctx.trace.session.memory_final})
    trace = post_trace(ctx, blocks=after.blocks, manifest=after.session.final_manifest, base=after)
    return MethodResult(trace, transitions=1)


def _drop(ctx: ForgetContext, drop: set[str], *, drop_derived_memory: bool) -> MethodResult:
    """Remove blocks from the state and rebuild the cache from the first removed position. The source's
    persistent record always goes; ``drop_derived_memory`` also removes write-backs derived from it."""
    kept = [b for b in ctx.trace.blocks if b.id not in drop]
    manifest = [b for b in ctx.trace.session.final_manifest if b not in drop]
    kept = materialise(ctx, kept, manifest)
    dropped_calls = {c.call_id for c in ctx.trace.tool_calls if c.block_id in drop and not c.committed}
    calls = [c for c in ctx.trace.tool_calls if c.call_id not in dropped_calls]
    memory = [
        m
        for m in ctx.trace.session.memory_final
        if not (_is_source_record(m, ctx.source) or (drop_derived_memory and ctx.source in m.source_ids))
    ]
    trace = post_trace(ctx, blocks=kept, manifest=manifest, memory=memory, tool_calls=calls)
    return MethodResult(trace, transitions=0)


@method(
    "b3",
    "source redaction: drop the source block, keep every derived artifact verbatim, rebuild the cache",
    place=3,
)
def source_redaction(ctx: ForgetContext) -> MethodResult:
    entries = {b.id for b in ArtifactGraph(ctx.trace.blocks).entry_blocks(ctx.source)}
    return _drop(ctx, entries, drop_derived_memory=False)


@method("b4", "sanitize without replay: drop the source and its taint closure, regenerate nothing", place=4)
def sanitize_no_replay(ctx: ForgetContext) -> MethodResult:
    return _drop(ctx, set(ctx.closure), drop_derived_memory=True)


@method(
    "b6", "sanitized rebuild: string-redact the known target strings everywhere, rebuild the cache", place=6
)
def sanitized_rebuild(ctx: ForgetContext) -> MethodResult:
    matcher = usable_matcher(ctx)
    tok = ctx.engine.tokenizer
    blocks = []
    for b in ctx.trace.blocks:
        if not matcher.found_in(b.text):
            blocks.append(b)
            continue
        update: dict[str, object] = {"text": matcher.redact(b.text, REDACTED)}
        if b.token_span is not None:
            raw = tok.decode(b.token_ids, skip_special_tokens=False)
            update["token_ids"] = list(
                tok(matcher.redact(raw, REDACTED), add_special_tokens=False)["input_ids"]
            )
        blocks.append(b.model_copy(update=update))
    manifest = list(ctx.trace.session.final_manifest)
    blocks = materialise(ctx, blocks, manifest)
    memory = [
        m.model_copy(update={"text": matcher.redact(m.text, REDACTED)})
        for m in ctx.trace.session.memory_final
    ]
    calls = []
    for c in ctx.trace.tool_calls:
        if c.arguments is not None and not c.committed:
            args = json.loads(matcher.redact(json.dumps(c.arguments), REDACTED))
            c = c.model_copy(update={"arguments": args, "raw": matcher.redact(c.raw, REDACTED)})
        calls.append(c)
    trace = post_trace(ctx, blocks=blocks, manifest=manifest, memory=memory, tool_calls=calls)
    return MethodResult(trace, transitions=0)
