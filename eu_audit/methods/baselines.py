"""The baselines of the paper's Methods paragraph: what deployed stacks and simple fixes do."""

from __future__ import annotations

import json

from eu_audit.episodes import Phase, Step, StepKind
from eu_audit.methods.base import (
    ForgetContext,
    Meter,
    MethodResult,
    materialise,
    method,
    post_trace,
    sink_policy_for,
    target_pattern,
)
from eu_audit.provenance import ArtifactGraph

REDACTED = "[REDACTED]"
FORGET_INSTRUCTION = "Forget this and never mention or use it again: {z}"


@method("b0", "no forget (the contaminated state as is)")
def no_forget(ctx: ForgetContext) -> MethodResult:
    meter = Meter(ctx)
    trace = post_trace(ctx, "b0", blocks=ctx.trace.blocks, manifest=ctx.trace.session.final_manifest)
    return MethodResult(trace, meter.ledger("b0", 0))


def _is_source_record(entry_sources: list[str], derived: bool, source: str) -> bool:
    return source in entry_sources and not derived


@method("b1", "memory delete: remove the persistent record, session untouched (what deployed stacks do)")
def memory_delete(ctx: ForgetContext) -> MethodResult:
    meter = Meter(ctx)
    memory = [
        m
        for m in ctx.trace.session.memory_final
        if not _is_source_record(m.source_ids, m.derived, ctx.source)
    ]
    trace = post_trace(
        ctx, "b1", blocks=ctx.trace.blocks, manifest=ctx.trace.session.final_manifest, memory=memory
    )
    return MethodResult(trace, meter.ledger("b1", 0))


@method("b2", "forget instruction: append an instruction to forget z (one more transition)")
def forget_instruction(ctx: ForgetContext) -> MethodResult:
    meter = Meter(ctx)
    agent = ctx.new_agent(world="factual", shadow=True)
    agent.resume(ctx.trace, ctx.checkpoint_at(ctx.T), held=ctx.trace.session.final_manifest)
    agent.step(
        Step(kind=StepKind.user, phase=Phase.further, content=FORGET_INSTRUCTION.format(z=ctx.request.target))
    )
    after = agent.trace()
    after.session = after.session.model_copy(update={"memory_final": ctx.trace.session.memory_final})
    trace = post_trace(ctx, "b2", blocks=after.blocks, manifest=after.session.final_manifest, base=after)
    return MethodResult(trace, meter.ledger("b2", 1))


def _drop(ctx: ForgetContext, name: str, drop: set[str]) -> MethodResult:
    """Remove blocks from the state and rebuild the cache from the first removed position."""
    meter = Meter(ctx)
    kept = [b for b in ctx.trace.blocks if b.id not in drop]
    manifest = [b for b in ctx.trace.session.final_manifest if b not in drop]
    kept = materialise(ctx, kept, manifest)
    dropped_calls = {c.call_id for c in ctx.trace.tool_calls if c.block_id in drop and not c.committed}
    calls = [c for c in ctx.trace.tool_calls if c.call_id not in dropped_calls]
    memory = [
        m
        for m in ctx.trace.session.memory_final
        if not (
            _is_source_record(m.source_ids, m.derived, ctx.source)
            or (name == "b4" and ctx.source in m.source_ids)
        )
    ]
    trace = post_trace(ctx, name, blocks=kept, manifest=manifest, memory=memory, tool_calls=calls)
    return MethodResult(trace, meter.ledger(name, 0))


@method(
    "b3", "source redaction: drop the source block, keep every derived artifact verbatim, rebuild the cache"
)
def source_redaction(ctx: ForgetContext) -> MethodResult:
    entries = {b.id for b in ArtifactGraph(ctx.trace.blocks).entry_blocks(ctx.source)}
    return _drop(ctx, "b3", entries)


@method("b4", "sanitize without replay: drop the source and its taint closure, regenerate nothing")
def sanitize_no_replay(ctx: ForgetContext) -> MethodResult:
    return _drop(ctx, "b4", set(ctx.closure))


@method("b6", "sanitized rebuild: string-redact the known target strings everywhere, rebuild the cache")
def sanitized_rebuild(ctx: ForgetContext) -> MethodResult:
    meter = Meter(ctx)
    pat = target_pattern(ctx.variants)
    tok = ctx.loaded.tokenizer
    blocks = []
    for b in ctx.trace.blocks:
        if not pat.search(b.text):
            blocks.append(b)
            continue
        update: dict[str, object] = {"text": pat.sub(REDACTED, b.text)}
        if b.token_span is not None:
            raw = tok.decode(b.token_ids, skip_special_tokens=False)
            update["token_ids"] = list(tok(pat.sub(REDACTED, raw), add_special_tokens=False)["input_ids"])
        blocks.append(b.model_copy(update=update))
    manifest = list(ctx.trace.session.final_manifest)
    blocks = materialise(ctx, blocks, manifest)
    memory = [
        m.model_copy(update={"text": pat.sub(REDACTED, m.text)}) for m in ctx.trace.session.memory_final
    ]
    calls = []
    for c in ctx.trace.tool_calls:
        if c.arguments is not None and not c.committed:
            args = json.loads(pat.sub(REDACTED, json.dumps(c.arguments)))
            c = c.model_copy(update={"arguments": args, "raw": pat.sub(REDACTED, c.raw)})
        calls.append(c)
    trace = post_trace(ctx, "b6", blocks=blocks, manifest=manifest, memory=memory, tool_calls=calls)
    return MethodResult(trace, meter.ledger("b6", 0))


@method("b8", "FIDES-style information-flow control: block identifier sinks carrying z, no state cleanup")
def ifc_only(ctx: ForgetContext) -> MethodResult:
    meter = Meter(ctx)
    trace = post_trace(
        ctx,
        "b8",
        blocks=ctx.trace.blocks,
        manifest=ctx.trace.session.final_manifest,
        sink_policy=sink_policy_for(ctx),
    )
    return MethodResult(trace, meter.ledger("b8", 0))
