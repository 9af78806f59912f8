"""What every forget method shares: the contaminated base state, the forget request resolved against
provenance, and the helpers that turn an edited session into a post-forget state.

Every method branches from the *same* contaminated base state R_T (the recorded session's final cache,
rebuilt from its token ids), so comparisons are paired. A method returns the post-forget state as a
session trace (blocks, cache manifest, memory, tool calls) plus the transitions it invoked; the runner
(``unlearn``) names it, meters it and writes its ledger, so a method's name is written once, in its
``@method`` decorator.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eu_audit.checkpoints import Checkpoint, CheckpointReason, manifest_at
from eu_audit.engines import KVEngine, TokenAccount
from eu_audit.engines.base import ABILITY_NAMES, Abilities
from eu_audit.errors import BadInput
from eu_audit.matching import TargetMatcher
from eu_audit.registry import Registry, forwards_registration
from eu_audit.runtime.agent import Agent, AgentSettings, FixedTurns, ReplayInputs
from eu_audit.runtime.chat import ChatFormat
from eu_audit.runtime.memory import MemoryStore, Outbox
from eu_audit.runtime.tools import load_toolset
from eu_audit.runtime.world import World
from eu_audit.trace.blocks import RuntimeBlock
from eu_audit.trace.records import ForgetRequestRecord, LedgerRecord, MemoryEntry, SinkPolicy
from eu_audit.trace.session import SessionTrace


def locate(trace: SessionTrace, request: ForgetRequestRecord) -> tuple[str, int, set[str]]:
    """Lines 1-3 of Algorithm 1 on the recorded provenance: LocateSource, FirstEntry, TaintClosure, as
    (s, tau, closure). Needs no model, so ``unlearn`` calls it on every session before one loads: a target
    that never entered, or a source that does not exist, is refused at once (BadInput)."""
    g = trace.graph()
    located = g.locate_source(request.target, request.variants)  # BadInput if z is absent
    source = request.source or located
    tau = g.first_entry(source)  # BadInput if s does not exist
    return source, tau, g.taint_closure(source)


@dataclass
class ForgetContext:
    chat: ChatFormat
    engine: KVEngine
    trace: SessionTrace  # the recorded, contaminated session
    request: ForgetRequestRecord  # (z, s)
    settings: AgentSettings  # the recording's decoding settings
    outbox: Outbox  # the real sink: replay reads it (a call id in it never fires again), never writes
    method: str = ""  # the method being applied (set by the runner)
    source: str = ""
    tau: int = 0
    closure: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.source, self.tau, self.closure = locate(self.trace, self.request)

    @property
    def variants(self) -> list[str]:
        return [self.request.target, *self.request.variants]

    def matcher(self) -> TargetMatcher:
        return TargetMatcher.of(self.request.target, self.request.variants)

    @property
    def T(self) -> int:
        return self.trace.session.transitions

    def base_tokens(self) -> list[list[int]]:
        blocks = {b.id: b for b in self.trace.blocks}
        return [blocks[b].token_ids for b in self.trace.session.final_manifest]

    def base_state(self) -> None:
        """Put the engine back at the contaminated R_T: crop to the longest segment prefix it still
        shares with the base, prefill the rest from recorded ids (exact under the schedule)."""
        cur = self.engine.tokens
        keep, offset = 0, 0
        segments = self.base_tokens()
        for seg in segments:
            if cur[offset : offset + len(seg)] != seg:
                break
            keep, offset = keep + 1, offset + len(seg)
        self.engine.crop(offset)
        for seg in segments[keep:]:
            self.engine.prefill(seg)

    def new_agent(
        self,
        *,
        world: World = "counterfactual",
        shadow: bool = True,
        fixed_turns: FixedTurns | None = None,
        sink_policy: SinkPolicy | None = None,
    ) -> Agent:
        settings = AgentSettings(
            max_tokens=self.settings.max_tokens,
            temperature=self.settings.temperature,
            seed=self.trace.session.seed,
            checkpoint_policy=self.settings.checkpoint_policy,
            world=world,
            shadow_consequential=shadow,
        )
        # The agent keeps the recorded session id so call ids match the record (dedup by call id).
        return Agent(
            self.engine,
            self.chat,
            self.trace.session.episode,
            self.trace.session_id,
            settings,
            MemoryStore(Path(":memory:")),
            self.outbox,
            replay=ReplayInputs(recorded_calls=self.trace.tool_calls, fixed_turns=fixed_turns or {}),
            sink_policy=sink_policy,
        )

    def checkpoint_at(self, boundary: int) -> Checkpoint:
        """A handle on the recorded state R_boundary (for a state the cache or a prefix cache holds)."""
        return Checkpoint(
            id=f"state@{boundary}",
            boundary=boundary,
            reasons=[CheckpointReason.turn],
            token_offset=0,
            cache_handle="",
            env_snapshot_id="",
            manifest=manifest_at(self.trace.blocks, boundary),
        )


@dataclass
class MethodResult:
    trace: SessionTrace  # the post-forget state
    transitions: int  # invocations of F (transitions replayed)
    checkpoint_id: str | None = None  # the checkpoint a replay restored from


@dataclass(frozen=True)
class MethodSpec:
    name: str
    description: str
    fn: Callable[[ForgetContext], MethodResult]
    #: engine abilities the method needs (``eu_audit.engines.Abilities`` field names); excision: "excise"
    needs: frozenset[str] = frozenset()
    #: its place in ``all`` and in every table: the paper's order for the built-ins, plug-ins after them
    place: float = 100.0
    #: run under ``--method all`` (a plug-in may leave itself out)
    in_all: bool = True

    def runs_on(self, abilities: Abilities) -> bool:
        return all(getattr(abilities, a) for a in self.needs)


METHODS: Registry[MethodSpec] = Registry(
    "methods",
    builtins=("eu_audit.methods.baselines", "eu_audit.methods.selective", "eu_audit.methods.excision"),
)


def method(
    name: str,
    description: str,
    *,
    needs: Iterable[str] = (),
    place: float = 100.0,
    in_all: bool = True,
) -> Callable[[Callable[[ForgetContext], MethodResult]], Callable[[ForgetContext], MethodResult]]:
    """Register a forget method: ``@method("b7", "selective replay")`` on ``fn(ctx) -> MethodResult``.
    ``needs`` names engine abilities (``"excise"``); ``place`` orders it in ``all`` and the tables."""
    unknown = set(needs) - set(ABILITY_NAMES)
    if unknown:
        raise ValueError(
            f"method '{name}' needs unknown abilities {sorted(unknown)} (known: {ABILITY_NAMES})"
        )

    @forwards_registration
    def deco(fn: Callable[[ForgetContext], MethodResult]) -> Callable[[ForgetContext], MethodResult]:
        METHODS.add(name, MethodSpec(name, description, fn, frozenset(needs), place, in_all))
        return fn

    return deco


def method_order() -> list[str]:
    """Every registered method in its place (the paper's order, then plug-ins by name)."""
    return [s.name for s in sorted(METHODS.in_order(), key=lambda s: (s.place, s.name))]


def all_methods() -> list[str]:
    """What ``--method all`` means: every method in its place that does not leave itself out."""
    return [m for m in method_order() if METHODS.get(m).in_all]


def apply_method(ctx: ForgetContext, name: str) -> tuple[MethodResult, LedgerRecord]:
    """Run one method on the context's base state; return its post-forget state and its ledger."""
    spec = METHODS.get(name)
    ctx.method = spec.name
    start, t0 = ctx.engine.account.copy(), time.perf_counter()
    result = spec.fn(ctx)
    d: TokenAccount = ctx.engine.account.since(start)
    ledger = LedgerRecord(
        session_id=result.trace.session_id,
        method=spec.name,
        transitions_replayed=result.transitions,
        tokens_reused=d.reused if ctx.engine.reuse_reported else None,
        tokens_prefilled=d.prefilled,
        tokens_decoded=d.decoded,
        wall_s=round(time.perf_counter() - t0, 4),
        checkpoint_id=result.checkpoint_id,
        tau=ctx.tau,
        closure_size=len(ctx.closure),
    )
    return result, ledger


# -- helpers the methods share ---------------------------------------------------------------------


def post_trace(
    ctx: ForgetContext,
    *,
    blocks: Sequence[RuntimeBlock],
    manifest: Sequence[str],
    memory: Sequence[MemoryEntry] | None = None,
    tool_calls: Iterable[object] | None = None,
    base: SessionTrace | None = None,
    sink_policy: SinkPolicy | None = None,
    kv_excised: Sequence[tuple[int, int]] = (),
) -> SessionTrace:
    """Package a post-forget state as a session trace linked to the recorded session."""
    src = base or ctx.trace
    kept = {b.id for b in blocks}
    clean_blocks = [b.model_copy(update={"parents": [p for p in b.parents if p in kept]}) for b in blocks]
    session = src.session.model_copy(
        update={
            "session_id": f"{ctx.trace.session_id}/{ctx.method}",
            "method": ctx.method,
            "parent_session": ctx.trace.session_id,
            "final_manifest": list(manifest),
            "memory_final": list(src.session.memory_final if memory is None else memory),
            "sink_policy": sink_policy,
            "kv_excised": list(kv_excised),
            "transitions": max([ctx.T, *(o.t for o in src.observations)]),
        }
    )
    sid = session.session_id
    calls = list(src.tool_calls if tool_calls is None else tool_calls)
    return SessionTrace(
        session=session,
        observations=[o.model_copy(update={"session_id": sid}) for o in src.observations],
        blocks=clean_blocks,
        tool_calls=[c.model_copy(update={"session_id": sid}) for c in calls],  # type: ignore[attr-defined]
        checkpoints=[],
        forget_requests=[ctx.request.model_copy(update={"session_id": sid})],
    )


def materialise(
    ctx: ForgetContext, blocks: Sequence[RuntimeBlock], manifest: Sequence[str]
) -> list[RuntimeBlock]:
    """Make the engine's cache hold ``manifest`` (edited blocks included): keep by a crop the leading
    blocks the base state already holds unchanged, prefill the rest one block at a time. Returns the
    blocks with token spans of the new timeline."""
    by_id = {b.id: b for b in blocks}
    recorded = {b.id: b for b in ctx.trace.blocks}
    base = ctx.trace.session.final_manifest
    keep = 0
    while (
        keep < min(len(base), len(manifest))
        and base[keep] == manifest[keep]
        and by_id[manifest[keep]].token_ids == recorded[base[keep]].token_ids
    ):
        keep += 1
    offset = sum(len(by_id[b].token_ids) for b in manifest[:keep])
    ctx.engine.crop(offset)
    spans: dict[str, tuple[int, int]] = {}
    pos = 0
    for i, bid in enumerate(manifest):
        ids = by_id[bid].token_ids
        if i >= keep:
            ctx.engine.prefill(ids)
        spans[bid] = (pos, pos + len(ids))
        pos += len(ids)
    return [
        b.model_copy(update={"token_span": spans.get(b.id)}) if b.token_span is not None else b
        for b in blocks
    ]


def usable_matcher(ctx: ForgetContext) -> TargetMatcher:
    """The request's matcher, refused when no variant is long enough to match on purpose."""
    m = ctx.matcher()
    if not m.usable:
        raise BadInput("the forget request has no usable target string (3 letters or digits at least)")
    return m


def sink_policy_for(ctx: ForgetContext) -> SinkPolicy:
    episode = ctx.trace.session.episode
    toolset = load_toolset(episode.toolset)
    return SinkPolicy(
        blocked_values=ctx.variants,
        identifier_args={t: list(toolset[t].identifier_args) for t in episode.tools if t in toolset},
    )
