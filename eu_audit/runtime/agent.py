"""The agent runtime: the transition function F. One transition = one observation + one model turn.

The agent keeps the session's runtime state (KV cache through the engine, resident prompt blocks, the
persistent memory store, tool plans, the environment) and records every artifact as a RuntimeBlock with
its provenance, so that a later forget can find where a target entered and what it touched.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from eu_audit.bundle.io import SessionTrace
from eu_audit.bundle.records import (
    ForgetRequest,
    MemoryEntry,
    ObservationRecord,
    SessionRecord,
    SinkPolicy,
    TargetInfo,
    ToolCallRecord,
)
from eu_audit.checkpoints import (
    Checkpoint,
    CheckpointPolicy,
    CheckpointReason,
    CheckpointStore,
    common_prefix,
    manifest_at,
)
from eu_audit.episodes import Episode, Step, StepKind
from eu_audit.errors import BadInput, RunFailed
from eu_audit.provenance import ArtifactGraph
from eu_audit.runtime.blocks import BlockType, RuntimeBlock
from eu_audit.runtime.chat import ChatFormat
from eu_audit.runtime.engine import HFEngine, Sampling
from eu_audit.runtime.memory import MemoryStore, Outbox, memory_text
from eu_audit.runtime.tools import ToolError, ToolSpec, load_toolset, parse_tool_calls

DEFAULT_SYSTEM = (
    "You are a personal assistant agent acting for one user. Be brief. "
    'To use a tool, write <tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call>.\n'
    "Tools:\n{tools}"
)
INSTRUCTIONS = {
    StepKind.compact: "Context compaction: summarize the conversation so far in at most three sentences. "
    "Keep every fact about the user and every pending task.",
    StepKind.plan: "Write the next tool call you plan to make, as <tool_call>{...}</tool_call>. "
    "It will run later.",
    StepKind.remember: "Write one line about the user to save to long-term memory.",
}

World = Literal["factual", "counterfactual"]
WRITE_BACK_PREFIX = "wb-t"  # memory records the model wrote (derived artifacts)


def derive_seed(*parts: object) -> int:
    """A per-turn seed from the session seed and the turn index, so matched seeds line up across runs
    that share a turn (B7 vs B5) instead of depending on how many samples came before."""
    h = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:4], "big")


def env_snapshot_id(env: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(env, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class AgentSettings:
    max_tokens: int = 48
    temperature: float = 0.0
    seed: int = 0
    checkpoint_policy: CheckpointPolicy = CheckpointPolicy.every_turn
    world: World = "factual"
    #: replay mode: consequential calls are shadow-executed on the agent's environment copy and never
    #: reach the outbox; a call id that already fired takes its recorded result (dedup by call id)
    shadow_consequential: bool = False


class Agent:
    def __init__(
        self,
        engine: HFEngine,
        chat: ChatFormat,
        episode: Episode,
        session_id: str,
        settings: AgentSettings,
        memory: MemoryStore,
        outbox: Outbox,
        recorded_calls: Sequence[ToolCallRecord] = (),
    ) -> None:
        self.engine, self.chat, self.episode = engine, chat, episode
        self.recorded_calls = {c.call_id: c for c in recorded_calls}
        self.sid, self.settings = session_id, settings
        self.memory, self.outbox = memory, outbox
        self.tokenizer = engine.loaded.tokenizer
        self.tools: dict[str, ToolSpec] = {}
        toolset = load_toolset(episode.toolset)
        for name in episode.tools:
            if name not in toolset:  # fail early on an unknown tool
                raise BadInput(f"episode {episode.id}: tool '{name}' is not in toolset '{episode.toolset}'")
            self.tools[name] = toolset[name]
        world_env = (
            episode.env if settings.world == "factual" else (episode.counterfactual_env or episode.env)
        )
        self._world_env = world_env
        self.env: dict[str, Any] = copy.deepcopy(world_env)
        self.blocks: list[RuntimeBlock] = []
        self.graph = ArtifactGraph()
        self.observations: list[ObservationRecord] = []
        self.tool_calls: list[ToolCallRecord] = []
        self.checkpoints = CheckpointStore(
            settings.checkpoint_policy, handle_prefix=f"{engine.name}:{session_id}"
        )
        self.manifest: list[str] = []  # ids of the blocks resident in the cache, in order
        self.start_manifest: list[str] = []
        self._start_offset = 0
        self.t = 0
        self._pending_results: list[tuple[str, Any]] = []  # (tool_call block id, result) for tool_return
        self._side: HFEngine | None = None  # second cache for isolated (independent) sub-tasks
        #: t -> (observation ids, turn ids) of recorded independent turns that replay may re-prefill
        #: when the replayed observation is token-identical (so the turn's content is fixed)
        self.fixed_turns: dict[int, tuple[list[int], list[int]]] = {}
        self.fixed_reused = 0
        self.sink_policy: SinkPolicy | None = None  # IFC sink gating in force (B8, B9)
        stop = self._ids(chat.stop_strings[0])
        self._stop_ids = stop[-1:]
        self._closing = self._ids(chat.end)
        self._closing_after_stop = (
            self._ids(chat.end[len(chat.stop_strings[0]) :])
            if chat.end.startswith(chat.stop_strings[0])
            else []
        )

    # -- helpers -------------------------------------------------------------------------------
    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _add(
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

    def _checkpoint(self, reasons: set[CheckpointReason], boundary: int) -> None:
        self.checkpoints.register(
            boundary=boundary,
            reasons=reasons,
            token_offset=self.engine.offset,
            env_snapshot_id=env_snapshot_id(self.env),
            manifest=self.manifest,
        )

    def _boundary_reasons(self) -> set[CheckpointReason]:
        reasons = {CheckpointReason.turn}
        nxt = self.episode.steps[self.t] if self.t < len(self.episode.steps) else None
        if nxt is not None and nxt.kind is StepKind.memory:
            reasons.add(CheckpointReason.before_memory)
        if nxt is not None and nxt.kind is StepKind.compact:
            reasons.add(CheckpointReason.before_compaction)
        return reasons

    def system_prompt(self) -> str:
        tools = "\n".join(spec.signature() for spec in self.tools.values()) or "(none)"
        return (
            (self.episode.system or DEFAULT_SYSTEM)
            .replace("{tools}", tools)
            .replace("{{", "{")
            .replace("}}", "}")
        )

    # -- the session ---------------------------------------------------------------------------
    def start(self) -> None:
        """R_init: system prompt and the persistent memory, re-injected at session start."""
        self.engine.reset()
        self._add(
            BlockType.system,
            text=self.system_prompt(),
            ids=self._ids(self.chat.bos + self.chat.message("system", self.system_prompt())),
        )
        for item in self.episode.memory:
            if not any(r[0] == item.id for r in self.memory.records(self.sid)):
                self.memory.add(self.sid, item.id, item.text, [])
        records = self.memory.records(self.sid)
        text = memory_text((rid, txt) for rid, txt, _ in records)
        self._add(
            BlockType.memory,
            text=text,
            ids=self._ids(self.chat.message("system", text)),
            sources=[s for _, _, srcs in records for s in srcs],
        )
        self.start_manifest = list(self.manifest)
        self._start_offset = self.engine.offset
        self._checkpoint({CheckpointReason.session_start} | self._boundary_reasons(), boundary=0)

    def _observation(self, step: Step) -> tuple[BlockType, str, list[str], list[str], bool]:
        """(block type, text, parents, source ids, derived) of the step's observation."""
        factual = self.settings.world == "factual"
        text = step.content if factual or step.counterfactual is None else step.counterfactual
        sources = [step.source] if step.source and factual else []
        if step.kind is StepKind.user:
            return BlockType.user, text, [], sources, False
        if step.kind is StepKind.memory:
            rid = step.memory_id or f"m-t{self.t}"
            self.memory.add(self.sid, rid, text, sources)  # the persistent record the injection surfaces
            return (
                BlockType.memory,
                f"Memory record {rid} (retrieved from long-term memory): {text}",
                [],
                sources,
                False,
            )
        if step.kind is StepKind.tool:
            assert step.tool is not None
            call_block = self._add(
                BlockType.tool_call,
                text=json.dumps({"name": step.tool, "arguments": step.args}),
                resident=False,
                committed=True,
            )
            result = self._run_read_only(step.tool, step.args)
            spec = self.tools.get(step.tool)
            self.tool_calls.append(
                ToolCallRecord(
                    session_id=self.sid,
                    call_id=f"{self.sid}:t{self.t}:scaffold",
                    turn=self.t,
                    name=step.tool,
                    arguments=step.args,
                    raw="",
                    # a scaffold action (a booking that returns its id) moves the environment: restore
                    # must replay it like any committed consequential call
                    consequential=bool(spec and spec.consequential),
                    committed=True,
                    status="executed",
                    result=result,
                    block_id=call_block.id,
                )
            )
            return BlockType.tool_result, self._tool_response(result), [call_block.id], sources, False
        if step.kind is StepKind.tool_return:
            pending, self._pending_results = self._pending_results, []
            parents = [bid for bid, _ in pending]
            inherited = sorted({s for bid in parents for s in self.graph.blocks[bid].source_ids})
            result = [r for _, r in pending] if pending else "No tool call was made."
            return BlockType.tool_result, self._tool_response(result), parents, inherited, bool(pending)
        return BlockType.system, step.content or INSTRUCTIONS[step.kind], [], [], False

    @staticmethod
    def _tool_response(result: Any) -> str:
        return "<tool_response>\n" + json.dumps(result, sort_keys=True) + "\n</tool_response>"

    def _run_read_only(self, name: str, args: dict[str, Any]) -> Any:
        if name not in self.tools:
            return {"error": f"unknown tool {name}"}
        try:
            return self.tools[name].fn(self.env, args)
        except ToolError as exc:
            return {"error": str(exc)}

    def step(self, step: Step, *, turn_ids: Sequence[int] | None = None) -> RuntimeBlock:
        """Transition t: prefill the observation, then decode the model turn (or, when ``turn_ids`` is
        given, re-materialise a turn whose content is fixed, by one prefill)."""
        self.t += 1
        btype, text, parents, sources, derived = self._observation(step)
        role = "system" if btype in (BlockType.system, BlockType.memory) else "user"
        obs_ids = self._ids(self.chat.message(role, text) + self.chat.generation_prompt())
        obs = self._add(btype, text=text, ids=obs_ids, parents=parents, sources=sources, derived=derived)
        self.observations.append(
            ObservationRecord(
                session_id=self.sid,
                t=self.t,
                kind=step.kind.value,
                phase=step.phase.value,
                content=text,
                source_ids=obs.source_ids,
                independent=step.independent,
                block_id=obs.id,
            )
        )
        turn = self._turn(step, turn_ids)
        self._after_turn(step, turn)
        self._checkpoint(self._boundary_reasons(), boundary=self.t)
        return turn

    def _turn(self, step: Step, turn_ids: Sequence[int] | None) -> RuntimeBlock:
        obs = self.graph.blocks[self.manifest[-1]]
        fixed = self.fixed_turns.get(self.t) if step.independent else None
        if turn_ids is None and fixed is not None and fixed[0] == obs.token_ids:
            turn_ids = fixed[1]
            self.fixed_reused += 1
        if turn_ids is not None:
            ids = list(turn_ids)
            self.engine.prefill(ids)
        elif step.independent:
            ids = self._isolated_turn(step, obs)
            self.engine.prefill(ids)  # the finished turn enters the main context as one chunk
        else:
            ids = self.engine.generate_turn(sampling=self._sampling(), **self._turn_args(step))
        btype = {StepKind.compact: BlockType.summary, StepKind.plan: BlockType.plan}.get(
            step.kind, BlockType.assistant
        )
        text = self.tokenizer.decode(ids, skip_special_tokens=True).strip()
        if step.independent:
            # Structural independence: the turn was computed from the system prompt and its own
            # observation only, so it cannot depend on the target; its one parent says so.
            parents, sources = [self.manifest[0], obs.id], list(obs.source_ids)
        else:
            parents, sources = list(self.manifest), self.resident_sources()
        return self._add(
            btype,
            text=text,
            ids=ids,
            parents=parents,
            sources=sources,
            derived=True,
            independent=step.independent,
            already_in_cache=True,
        )

    def _sampling(self) -> Sampling:
        s = self.settings
        return Sampling(s.temperature, derive_seed(s.seed, self.t)) if s.temperature > 0 else Sampling()

    def _turn_args(self, step: Step) -> dict[str, Any]:
        return {
            "prefix_ids": self._ids(step.cue) if step.cue else [],
            "max_tokens": step.max_tokens or self.settings.max_tokens,
            "stop_ids": self._stop_ids,
            "closing_ids": self._closing,
            "closing_after_stop": self._closing_after_stop,
        }

    def _isolated_turn(self, step: Step, obs: RuntimeBlock) -> list[int]:
        """An independent step runs as an isolated sub-task: a second cache on the same model that
        holds only the system prompt and this observation (an unrelated sub-task, a routine poll).
        Its output is then fixed content in both worlds, which replay may re-prefill instead of
        re-decode. Its tokens are accounted on the main engine."""
        if self._side is None:
            self._side = type(self.engine)(self.engine.loaded)
            self._side.account = self.engine.account
        side = self._side
        side.reset()
        side.prefill(self.graph.blocks[self.manifest[0]].token_ids)
        side.prefill(obs.token_ids)
        return list(side.generate_turn(sampling=self._sampling(), **self._turn_args(step)))

    def _after_turn(self, step: Step, turn: RuntimeBlock) -> None:
        if step.kind is StepKind.compact:
            # Compaction rewrites the context: keep R_init (a crop), then inject the summary.
            self.engine.crop(self._start_offset)
            self.manifest = list(self.start_manifest)
            text = f"Summary of the conversation so far: {turn.text}"
            self._add(
                BlockType.summary,
                text=text,
                ids=self._ids(self.chat.message("system", text)),
                parents=[turn.id],
                sources=turn.source_ids,
                derived=True,
            )
            return
        if step.kind is StepKind.remember:
            rid = f"{WRITE_BACK_PREFIX}{self.t}"
            self.memory.add(self.sid, rid, turn.text, turn.source_ids)
            self._add(
                BlockType.memory,
                text=turn.text,
                parents=[turn.id],
                sources=turn.source_ids,
                resident=False,
                derived=True,
                committed=True,
            )
            return
        for k, (name, args, raw) in enumerate(parse_tool_calls(turn.text)):
            self._tool_call(step, turn, k, name, args, raw)

    def _tool_call(
        self, step: Step, turn: RuntimeBlock, k: int, name: str, args: dict[str, Any] | None, raw: str
    ) -> None:
        call_id = f"{self.sid}:t{self.t}:{k}"
        spec = self.tools.get(name)
        consequential = bool(spec and spec.consequential)
        block = self._add(
            BlockType.tool_call,
            text=raw,
            parents=[turn.id],
            sources=turn.source_ids,
            resident=False,
            derived=True,
        )
        status: Any
        result: Any = None
        committed = False
        if (
            spec is not None
            and args is not None
            and self.sink_policy is not None
            and self.sink_policy.blocks(name, args)
        ):
            status, result = (
                "blocked",
                {"error": "blocked by the sink policy: a tainted value in an identifier argument"},
            )
        elif spec is None:
            status = "unknown_tool"
        elif args is None:
            status = "malformed"
        elif step.kind is StepKind.plan:
            status = "pending"  # a pending plan: recorded, not executed
        elif consequential and self.settings.shadow_consequential:
            fired = self.recorded_calls.get(call_id)
            if fired is not None and fired.committed:
                result, committed = fired.result, True  # it already happened once: never again
                spec.fn(self.env, args)  # the environment still moves as it did
            else:
                result = spec.fn(self.env, args)  # counterfactual call: computed, not performed
            status = "shadowed"
        elif consequential:
            # Checkpoint before the side effect: replay can restore to a state where it has not fired.
            self._checkpoint({CheckpointReason.before_consequential}, boundary=self.t)
            self.outbox.fire(call_id, self.sid, name, args)
            result = spec.fn(self.env, args)
            status, committed = "executed", True
        else:
            result = self._run_read_only(name, args)
            status = "executed"
        block.committed = committed
        if status in ("executed", "shadowed", "blocked"):
            self._pending_results.append((block.id, result))
        self.tool_calls.append(
            ToolCallRecord(
                session_id=self.sid,
                call_id=call_id,
                turn=self.t,
                name=name,
                arguments=args,
                raw=raw,
                consequential=consequential,
                committed=committed,
                status=status,
                result=result,
                block_id=block.id,
            )
        )

    def resume(
        self,
        trace: SessionTrace,
        checkpoint: Checkpoint,
        boundary: int | None = None,
        held: Sequence[str] | None = None,
    ) -> int:
        """Continue a recorded session at R_boundary (default: the checkpoint's own boundary).

        The cache keeps, by one crop, what it shares with the checkpoint's manifest (Lemma 1: cropping
        is restoring); recorded blocks still missing up to ``boundary`` (the checkpoint's remainder,
        blocks a compaction dropped, clean transitions between the checkpoint and ``boundary``) are
        prefilled from their recorded token ids, which is exact under the canonical schedule and
        invokes no model turn. The agent adopts the recorded artifacts of transitions 1..boundary and
        rebuilds the environment and memory store at that point. ``held`` is the manifest the engine's
        cache holds now (default: this agent's own). Returns the tokens re-prefilled."""
        boundary = checkpoint.boundary if boundary is None else boundary
        if boundary < checkpoint.boundary:
            raise ValueError(f"cannot resume at {boundary} from a later checkpoint ({checkpoint.boundary})")
        recorded = {b.id: b for b in trace.blocks}
        missing = [b for b in checkpoint.manifest if b not in recorded]
        if missing:
            raise RunFailed(f"checkpoint {checkpoint.id} names block {missing[0]} that the trace lacks")
        target = manifest_at(trace.blocks, boundary)
        held = list(self.manifest if held is None else held)
        keep = min(common_prefix(held, checkpoint.manifest), common_prefix(checkpoint.manifest, target))
        if not held:
            self.engine.reset()
        self.engine.crop(sum(len(recorded[b].token_ids) for b in held[:keep]))
        before = self.engine.account.prefilled
        for bid in target[keep:]:
            self.engine.prefill(recorded[bid].token_ids)
        keep_blocks = [b for b in trace.blocks if b.turn <= boundary]
        self.blocks = [b.model_copy(deep=True) for b in keep_blocks]
        self.graph = ArtifactGraph(self.blocks)
        self.manifest = list(target)
        self.start_manifest = [b.id for b in keep_blocks if b.turn == 0 and b.token_span is not None]
        self._start_offset = sum(len(recorded[b].token_ids) for b in self.start_manifest)
        self.t = boundary
        calls = [c for c in trace.tool_calls if c.turn <= boundary]
        self.tool_calls = [c.model_copy(deep=True) for c in calls]
        self.observations = [o for o in trace.observations if o.t <= boundary]
        # The environment at the boundary: the world's initial env plus the committed effects before it
        # (identical in both worlds before tau, Lemma 1). Only the factual world has a snapshot to match.
        self.env = copy.deepcopy(self._world_env)
        for c in calls:
            if c.consequential and c.committed and c.arguments is not None:
                self.tools[c.name].fn(self.env, c.arguments)
        # Empty for handles not taken during the recording; a before_consequential snapshot predates
        # its transition's side effect, while R_boundary includes it: nothing to compare then.
        recorded_env = checkpoint.env_snapshot_id
        if CheckpointReason.before_consequential in checkpoint.reasons:
            recorded_env = ""
        if (
            recorded_env
            and self.settings.world == "factual"
            and boundary == checkpoint.boundary
            and env_snapshot_id(self.env) != recorded_env
        ):
            raise RunFailed(
                f"environment at checkpoint {checkpoint.id} cannot be reproduced (its snapshot id differs)"
            )
        self._seed_memory(boundary)
        self._pending_results = [
            (c.block_id, c.result)
            for c in calls
            if c.turn == boundary and c.status in ("executed", "shadowed") and c.raw
        ]
        self.checkpoints.items = [c for c in trace.checkpoints if c.boundary <= boundary]
        return self.engine.account.prefilled - before

    def _seed_memory(self, boundary: int) -> None:
        """The persistent store as it stood after transition ``boundary``."""
        for item in self.episode.memory:
            self.memory.add(self.sid, item.id, item.text, [])
        for t, step in enumerate(self.episode.steps[:boundary], 1):
            if step.kind is StepKind.memory:
                factual = self.settings.world == "factual"
                text = step.content if factual or step.counterfactual is None else step.counterfactual
                sources = [step.source] if step.source and factual else []
                self.memory.add(self.sid, step.memory_id or f"m-t{t}", text, sources)
        for b in self.blocks:
            if b.type is BlockType.memory and b.derived and b.token_span is None:
                self.memory.add(self.sid, f"{WRITE_BACK_PREFIX}{b.turn}", b.text, b.source_ids)

    def run(self) -> SessionTrace:
        self.start()
        for step in self.episode.steps:
            self.step(step)
        return self.trace()

    def trace(self) -> SessionTrace:
        ep = self.episode
        session = SessionRecord(
            session_id=self.sid,
            episode_id=ep.id,
            suite=ep.suite,
            transitions=len(ep.steps),
            seed=self.settings.seed,
            target=TargetInfo(value=ep.target.value, variants=ep.target.variants, kind=ep.target.kind),
            source_id=ep.source_id,
            final_manifest=list(self.manifest),
            memory_final=[
                MemoryEntry(id=r, text=t, source_ids=src, derived=r.startswith(WRITE_BACK_PREFIX))
                for r, t, src in self.memory.records(self.sid)
            ],
            episode=ep,
        )
        forget = ForgetRequest(
            session_id=self.sid,
            target=ep.target.value,
            source=ep.source_id,
            variants=ep.target.variants,
            reason="episode script",
        )
        return SessionTrace(
            session=session,
            observations=list(self.observations),
            blocks=list(self.blocks),
            tool_calls=list(self.tool_calls),
            checkpoints=list(self.checkpoints.items),
            forget_requests=[forget] if self.settings.world == "factual" else [],
        )
