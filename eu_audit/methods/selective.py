"""Replay-based methods: the reference (B5), the prefix-cache control (B5'), selective replay (B7,
Algorithm 1) and B9 = IFC + selective replay."""

from __future__ import annotations

from eu_audit.checkpoints import CheckpointStore, manifest_at
from eu_audit.methods.base import ForgetContext, Meter, MethodResult, method, post_trace, sink_policy_for
from eu_audit.replay import replay_suffix


@method("b5", "full reset: re-run the whole session from R_init on the counterfactual stream (the reference)")
def full_reset(ctx: ForgetContext) -> MethodResult:
    meter = Meter(ctx)
    agent = ctx.new_agent()
    after = agent.run()  # start() resets the engine: nothing is reused
    trace = post_trace(ctx, "b5", blocks=after.blocks, manifest=after.session.final_manifest, base=after)
    return MethodResult(trace, meter.ledger("b5", ctx.T))


@method("b5p", "full reset + prefix cache: reuse the longest cached clean prefix, re-decode the whole suffix")
def full_reset_prefix_cache(ctx: ForgetContext) -> MethodResult:
    meter = Meter(ctx)
    # A generic prefix cache holds the current (contaminated) cache; it can serve the longest clean
    # boundary whose whole context is still a prefix of it. It knows nothing of provenance, so every
    # later turn is decoded again.
    final = ctx.trace.session.final_manifest
    boundary = max(
        b
        for b in range(ctx.tau)
        if manifest_at(ctx.trace.blocks, b) == final[: len(manifest_at(ctx.trace.blocks, b))]
    )
    agent = ctx.new_agent()
    stats = replay_suffix(
        agent, ctx.trace, ctx.checkpoint_at(boundary), boundary, reuse_fixed=False, held=final
    )
    after = agent.trace()
    trace = post_trace(ctx, "b5p", blocks=after.blocks, manifest=after.session.final_manifest, base=after)
    return MethodResult(trace, meter.ledger("b5p", stats.transitions))


def _selective_replay(ctx: ForgetContext, name: str) -> MethodResult:
    meter = Meter(ctx)
    store = CheckpointStore()
    store.items = list(ctx.trace.checkpoints)
    c_star = store.latest_before(ctx.tau)  # line 4
    agent = ctx.new_agent()
    # lines 5-10: crop to c*, re-prefill recorded clean blocks up to tau-1 (no F invoked: Lemma 1),
    # then re-enact tau..T: exactly T - tau + 1 transitions.
    stats = replay_suffix(
        agent, ctx.trace, c_star, ctx.tau - 1, reuse_fixed=True, held=ctx.trace.session.final_manifest
    )
    after = agent.trace()
    trace = post_trace(
        ctx,
        name,
        blocks=after.blocks,
        manifest=after.session.final_manifest,
        base=after,
        sink_policy=sink_policy_for(ctx) if name == "b9" else None,
    )
    return MethodResult(trace, meter.ledger(name, stats.transitions, checkpoint_id=c_star.id))


@method(
    "b7",
    "selective replay (Algorithm 1): crop to the last clean checkpoint, replay the sanitized suffix",
)
def selective_replay(ctx: ForgetContext) -> MethodResult:
    return _selective_replay(ctx, "b7")


@method("b9", "IFC + selective replay: B8's sink policy over B7's state")
def ifc_and_replay(ctx: ForgetContext) -> MethodResult:
    return _selective_replay(ctx, "b9")
