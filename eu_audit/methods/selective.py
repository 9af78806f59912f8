"""Replay-based methods: the reference (B5), the prefix-cache control (B5'), selective replay (B7,
Algorithm 1), IFC at the sinks (B8, re-enacted under its policy) and B9 = IFC + selective replay."""

from __future__ import annotations

from eu_audit.checkpoints import CheckpointStore, manifest_at
from eu_audit.methods.base import ForgetContext, MethodResult, method, post_trace, sink_policy_for
from eu_audit.replay import recorded_fixed_turns, replay_suffix
from eu_audit.runtime.world import World
from eu_audit.trace.records import SinkPolicy


@method(
    "b5",
    "full reset: re-run the whole session from R_init on the counterfactual stream (the reference)",
    place=5,
)
def full_reset(ctx: ForgetContext) -> MethodResult:
    agent = ctx.new_agent()
    after = agent.run()  # start() resets the engine: nothing is reused
    trace = post_trace(ctx, blocks=after.blocks, manifest=after.session.final_manifest, base=after)
    return MethodResult(trace, transitions=ctx.T)


@method(
    "b5p",
    "full reset + prefix cache: reuse the longest cached clean prefix, re-decode the whole suffix",
    place=5.5,
)
def full_reset_prefix_cache(ctx: ForgetContext) -> MethodResult:
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
    stats = replay_suffix(agent, ctx.trace, ctx.checkpoint_at(boundary), boundary, held=final)
    after = agent.trace()
    trace = post_trace(ctx, blocks=after.blocks, manifest=after.session.final_manifest, base=after)
    return MethodResult(trace, transitions=stats.transitions)


def _replay_from_tau(ctx: ForgetContext, *, world: World, sink_policy: SinkPolicy | None) -> MethodResult:
    """Crop to the last checkpoint before tau and re-enact tau..T in ``world`` with ``sink_policy`` in
    force at every tool call (a blocked call is recorded as blocked and never runs)."""
    store = CheckpointStore()
    store.items = list(ctx.trace.checkpoints)
    c_star = store.latest_before(ctx.tau)  # line 4
    agent = ctx.new_agent(world=world, fixed_turns=recorded_fixed_turns(ctx.trace), sink_policy=sink_policy)
    # lines 5-10: crop to c*, re-prefill recorded clean blocks up to tau-1 (no F invoked: Lemma 1),
    # then re-enact tau..T: exactly T - tau + 1 transitions.
    stats = replay_suffix(agent, ctx.trace, c_star, ctx.tau - 1, held=ctx.trace.session.final_manifest)
    after = agent.trace()
    trace = post_trace(
        ctx, blocks=after.blocks, manifest=after.session.final_manifest, base=after, sink_policy=sink_policy
    )
    return MethodResult(trace, transitions=stats.transitions, checkpoint_id=c_star.id)


def _selective_replay(ctx: ForgetContext, *, with_sink_policy: bool) -> MethodResult:
    policy = sink_policy_for(ctx) if with_sink_policy else None
    return _replay_from_tau(ctx, world="counterfactual", sink_policy=policy)


@method(
    "b7",
    "selective replay (Algorithm 1): crop to the last clean checkpoint, replay the sanitized suffix",
    place=7,
)
def selective_replay(ctx: ForgetContext) -> MethodResult:
    return _selective_replay(ctx, with_sink_policy=False)


@method("b9", "IFC + selective replay: B8's sink policy in force over B7's replay", place=9)
def ifc_and_replay(ctx: ForgetContext) -> MethodResult:
    return _selective_replay(ctx, with_sink_policy=True)


@method(
    "b8",
    "FIDES-style information-flow control: from tau on, tool calls whose identifier arguments carry z are "
    "blocked at the sink; free text and state keep z (simulated by re-running tau..T under the policy)",
    place=8,
)
def ifc_only(ctx: ForgetContext) -> MethodResult:
    # A deployed IFC layer is in force while the session runs; here the session already ran, so tau..T is
    # re-enacted on the recorded (factual) observations with the policy at every sink: the same turns up
    # to the first blocked call (an exact engine), then whatever the agent does without that call's result.
    return _replay_from_tau(ctx, world="factual", sink_policy=sink_policy_for(ctx))
