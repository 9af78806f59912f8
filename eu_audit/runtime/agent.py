"""The agent runtime: the transition function F. One transition = one observation + one model turn.

The agent keeps the session's runtime state (KV cache through the engine, resident prompt blocks, the
persistent memory store, tool plans, the environment) and records every artifact as a RuntimeBlock with
its provenance, so that a later forget can find where a target entered and what it touched.

What happens around a transition lives next door: which world's observation a step shows
(``world.py``), what a tool call does (``dispatch.py``), and how a recorded state is restored
(``resume.py``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eu_audit.checkpoints import Checkpoint, CheckpointPolicy, CheckpointReason, CheckpointStore
from eu_audit.defaults import TURN_MAX_TOKENS, TURN_TEMPERATURE
from eu_audit.engines import KVEngine, Sampling
from eu_audit.episodes import Episode, Step, StepKind
from eu_audit.errors import BadInput
from eu_audit.runtime.chat import ChatFormat
from eu_audit.runtime.context import Context
from eu_audit.runtime.dispatch import ToolDispatcher
from eu_audit.runtime.memory import WRITE_BACK_PREFIX, MemoryStore, Outbox, memory_text
from eu_audit.runtime.resume import resume
from eu_audit.runtime.tools import ToolSpec, load_toolset, parse_tool_calls
from eu_audit.runtime.world import World, WorldView, env_snapshot_id, memory_shown
from eu_audit.trace.blocks import BlockType, RuntimeBlock
from eu_audit.trace.records import (
    ForgetRequestRecord,
    MemoryEntry,
    ObservationRecord,
    SessionRecord,
    SinkPolicy,
    ToolCallRecord,
)
from eu_audit.trace.session import SessionTrace

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
_TURN_TYPES = {StepKind.compact: BlockType.summary, StepKind.plan: BlockType.plan}

#: t -> (observation ids, turn ids) of a recorded independent turn that replay may re-prefill
FixedTurns = Mapping[int, tuple[list[int], list[int]]]


def derive_seed(*parts: object) -> int:
    """A per-turn seed from the session seed and the turn index, so matched seeds line up across runs
    that share a turn (B7 vs B5) instead of depending on how many samples came before."""
    h = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:4], "big")


@dataclass(frozen=True)
class AgentSettings:
    max_tokens: int = TURN_MAX_TOKENS
    temperature: float = TURN_TEMPERATURE
    seed: int = 0
    checkpoint_policy: CheckpointPolicy = CheckpointPolicy.every_turn
    world: World = "factual"
    #: replay mode: consequential calls are shadow-executed on the agent's environment copy and never
    #: reach the outbox; a call id that already fired takes its recorded result (dedup by call id)
    shadow_consequential: bool = False
    #: a served agent: its host runs the tools it calls and sends the results as the next observation
    host_tools: bool = False


@dataclass(frozen=True)
class ReplayInputs:
    """What a replay hands the agent from the recording it re-enacts."""

    recorded_calls: Sequence[ToolCallRecord] = ()  # for dedup of consequential calls by call id
    fixed_turns: FixedTurns = field(default_factory=dict)  # independent turns it may re-prefill


class Agent:
    def __init__(
        self,
        engine: KVEngine,
        chat: ChatFormat,
        episode: Episode,
        session_id: str,
        settings: AgentSettings,
        memory: MemoryStore,
        outbox: Outbox,
        *,
        replay: ReplayInputs | None = None,
        sink_policy: SinkPolicy | None = None,
        tools: Mapping[str, ToolSpec] | None = None,
    ) -> None:
        self.engine, self.chat, self.episode = engine, chat, episode
        self.sid, self.settings = session_id, settings
        self.memory = memory
        self.tokenizer = engine.tokenizer
        self.view = WorldView(episode, settings.world)
        self.tools = dict(tools) if tools is not None else self._tools(episode)
        replay = replay or ReplayInputs()
        self.fixed_turns = dict(replay.fixed_turns)
        self.fixed_reused = 0  # independent turns re-materialised by prefill (replay only)
        self.dispatch = ToolDispatcher(
            self.tools,
            outbox,
            shadow=settings.shadow_consequential,
            sink_policy=sink_policy,
            recorded_calls=replay.recorded_calls,
            host=settings.host_tools,
        )
        self.env: dict[str, Any] = self.view.environment()
        self.context = Context(engine)
        self.observations: list[ObservationRecord] = []
        self.tool_calls: list[ToolCallRecord] = []
        self.checkpoints = CheckpointStore(
            settings.checkpoint_policy, handle_prefix=f"{engine.name}:{session_id}"
        )
        self.pending_results: list[tuple[str, Any]] = []  # (tool_call block id, result) for tool_return
        self._side: KVEngine | None = None  # second cache for isolated (independent) sub-tasks
        stop = self.encode(chat.stop_strings[0])
        self._stop_ids = stop[-1:]
        self._closing = self.encode(chat.end)
        self._closing_after_stop = (
            self.encode(chat.end[len(chat.stop_strings[0]) :])
            if chat.end.startswith(chat.stop_strings[0])
            else []
        )

    @staticmethod
    def _tools(episode: Episode) -> dict[str, ToolSpec]:
        toolset = load_toolset(episode.toolset)
        unknown = [name for name in episode.tools if name not in toolset]
        if unknown:  # fail early on an unknown tool
            raise BadInput(f"episode {episode.id}: tool '{unknown[0]}' is not in toolset '{episode.toolset}'")
        return {name: toolset[name] for name in episode.tools}

    # -- helpers -------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # the context's state, read by restore, replay and the tests
    @property
    def t(self) -> int:
        return self.context.t

    @property
    def blocks(self) -> list[RuntimeBlock]:
        return self.context.blocks

    @property
    def manifest(self) -> list[str]:
        return self.context.manifest

    def add_block(self, btype: BlockType, **kw: Any) -> RuntimeBlock:
        return self.context.add(btype, **kw)

    def checkpoint(self, reasons: set[CheckpointReason], boundary: int) -> None:
        self.checkpoints.register(
            boundary=boundary,
            reasons=reasons,
            token_offset=self.engine.offset,
            env_snapshot_id=env_snapshot_id(self.env),
            manifest=self.context.manifest,
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
        self.add_block(
            BlockType.system,
            text=self.system_prompt(),
            ids=self.encode(self.chat.bos + self.chat.message("system", self.system_prompt())),
        )
        for item in self.episode.memory:
            if not any(r[0] == item.id for r in self.memory.records(self.sid)):
                self.memory.add(self.sid, item.id, item.text, [])
        records = self.memory.records(self.sid)
        text = memory_text((rid, txt) for rid, txt, _ in records)
        self.add_block(
            BlockType.memory,
            text=text,
            ids=self.encode(self.chat.message("system", text)),
            sources=[s for _, _, srcs in records for s in srcs],
        )
        self.context.mark_start()
        self.checkpoint({CheckpointReason.session_start} | self._boundary_reasons(), boundary=0)

    def _observation(self, step: Step) -> tuple[BlockType, str, list[str], list[str], bool]:
        """(block type, text, parents, source ids, derived) of the step's observation."""
        text, sources = self.view.text(step), self.view.sources(step)
        if step.kind is StepKind.user:
            return BlockType.user, text, [], sources, False
        if step.kind is StepKind.memory:
            rid, text, sources = self.view.memory_record(step, self.t)
            self.memory.add(self.sid, rid, text, sources)  # the persistent record the injection surfaces
            shown = memory_shown(rid, text)
            return BlockType.memory, shown, [], sources, False
        if step.kind is StepKind.tool:
            return self._scaffold_tool(step, sources)
        if step.kind is StepKind.tool_return:
            pending, self.pending_results = self.pending_results, []
            parents = [bid for bid, _ in pending]
            inherited = sorted({s for bid in parents for s in self.context.graph.blocks[bid].source_ids})
            if self.settings.host_tools:  # the host ran the calls: its answer is the step's text
                shown = "<tool_response>\n" + text + "\n</tool_response>"
                return BlockType.tool_result, shown, parents, [*inherited, *sources], bool(pending)
            result = [r for _, r in pending] if pending else "No tool call was made."
            return BlockType.tool_result, self._tool_response(result), parents, inherited, bool(pending)
        return BlockType.system, step.content or INSTRUCTIONS[step.kind], [], [], False

    def _scaffold_tool(
        self, step: Step, sources: list[str]
    ) -> tuple[BlockType, str, list[str], list[str], bool]:
        """The scaffold runs a tool (the step names it); its result is the observation."""
        assert step.tool is not None
        call = self.add_block(
            BlockType.tool_call,
            text=json.dumps({"name": step.tool, "arguments": step.args}),
            resident=False,
            committed=True,
        )
        record = self.dispatch.scaffold(
            self.env, session_id=self.sid, t=self.t, name=step.tool, args=step.args, block_id=call.id
        )
        self.tool_calls.append(record)
        return BlockType.tool_result, self._tool_response(record.result), [call.id], sources, False

    @staticmethod
    def _tool_response(result: Any) -> str:
        return "<tool_response>\n" + json.dumps(result, sort_keys=True) + "\n</tool_response>"

    def step(self, step: Step, *, turn_ids: Sequence[int] | None = None) -> RuntimeBlock:
        """Transition t: prefill the observation, then decode the model turn (or, when ``turn_ids`` is
        given, re-materialise a turn whose content is fixed, by one prefill)."""
        self.context.t += 1
        btype, text, parents, sources, derived = self._observation(step)
        role = "system" if btype in (BlockType.system, BlockType.memory) else "user"
        obs_ids = self.encode(self.chat.message(role, text) + self.chat.generation_prompt())
        obs = self.add_block(btype, text=text, ids=obs_ids, parents=parents, sources=sources, derived=derived)
        self.observations.append(
            ObservationRecord(
                session_id=self.sid,
                t=self.t,
                kind=step.kind,
                phase=step.phase,
                content=text,
                source_ids=obs.source_ids,
                independent=step.independent,
                block_id=obs.id,
            )
        )
        turn = self._turn(step, turn_ids)
        self._after_turn(step, turn)
        self.checkpoint(self._boundary_reasons(), boundary=self.t)
        return turn

    def _turn(self, step: Step, turn_ids: Sequence[int] | None) -> RuntimeBlock:
        obs = self.context.last()
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
        text = self.tokenizer.decode(ids, skip_special_tokens=True).strip()
        if step.independent:
            # Structural independence: the turn was computed from the system prompt and its own
            # observation only, so it cannot depend on the target; its one parent says so.
            parents, sources = [self.manifest[0], obs.id], list(obs.source_ids)
        else:
            parents, sources = list(self.manifest), self.context.resident_sources()
        return self.add_block(
            _TURN_TYPES.get(step.kind, BlockType.assistant),
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
            "prefix_ids": self.encode(step.cue) if step.cue else [],
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
            self._side = self.engine.sibling()
        side = self._side
        side.reset()
        side.prefill(self.blocks[0].token_ids)  # the system prompt
        side.prefill(obs.token_ids)
        return list(side.generate_turn(sampling=self._sampling(), **self._turn_args(step)))

    def _after_turn(self, step: Step, turn: RuntimeBlock) -> None:
        if step.kind is StepKind.compact:
            # Compaction rewrites the context: keep R_init (a crop), then inject the summary.
            self.context.back_to_start()
            text = f"Summary of the conversation so far: {turn.text}"
            self.add_block(
                BlockType.summary,
                text=text,
                ids=self.encode(self.chat.message("system", text)),
                parents=[turn.id],
                sources=turn.source_ids,
                derived=True,
            )
            return
        if step.kind is StepKind.remember:
            rid = f"{WRITE_BACK_PREFIX}{self.t}"
            self.memory.add(self.sid, rid, turn.text, turn.source_ids)
            self.add_block(
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
        block = self.add_block(
            BlockType.tool_call,
            text=raw,
            parents=[turn.id],
            sources=turn.source_ids,
            resident=False,
            derived=True,
        )
        outcome, record = self.dispatch.model_call(
            self.env,
            session_id=self.sid,
            t=self.t,
            k=k,
            name=name,
            args=args,
            raw=raw,
            pending=step.kind is StepKind.plan,
            block_id=block.id,
            before_side_effect=lambda: self.checkpoint({CheckpointReason.before_consequential}, self.t),
        )
        block.committed = outcome.committed
        if outcome.returns or outcome.status == "requested":
            self.pending_results.append((block.id, outcome.result))
        self.tool_calls.append(record)

    def resume(
        self,
        trace: SessionTrace,
        checkpoint: Checkpoint,
        boundary: int | None = None,
        held: Sequence[str] | None = None,
    ) -> int:
        """Continue a recorded session at R_boundary; see ``eu_audit.runtime.resume``."""
        return resume(self, trace, checkpoint, boundary, held)

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
            source_id=ep.source_id,
            final_manifest=list(self.context.manifest),
            memory_final=[
                MemoryEntry(id=r, text=t, source_ids=src, derived=r.startswith(WRITE_BACK_PREFIX))
                for r, t, src in self.memory.records(self.sid)
            ],
            episode=ep,
        )
        forget = ForgetRequestRecord(
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
            forget_requests=[forget] if self.view.factual else [],
        )
