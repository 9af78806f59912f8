"""One tenant's episode stream as the harness feeds it to an agent eu-audit did not build: its messages,
tool calls (answered from the suite's toolset, consequential ones written once to the real outbox) and
memory steps, each kept as a block or call of the tenant's ``SessionTrace`` as it happens.

``tenant_run.TenantRun`` is this stream grown into a whole tenant run (the forget, the future turns, the
probes, the dumps and rechecks); this module holds what the stream itself needs."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from eu_audit.blackbox.adapter import AgentFailed, AgentUnderTest, AgentUnreachable, guarded
from eu_audit.blackbox.contract import (
    Capabilities,
    MemoryRecord,
    Message,
    OfferedTool,
    Turn,
)
from eu_audit.blackbox.options import AgentRecordOptions
from eu_audit.blackbox.serve_control import ServeControl
from eu_audit.blackbox.tamper import UserTurn
from eu_audit.episodes import Episode, Step, StepKind
from eu_audit.runtime.agent import INSTRUCTIONS
from eu_audit.runtime.memory import Outbox
from eu_audit.runtime.tools import ToolError, ToolSpec, load_toolset
from eu_audit.runtime.world import World, WorldView
from eu_audit.trace.blocks import BlockType, RuntimeBlock
from eu_audit.trace.records import SessionRecord, SkippedStep, ToolCallRecord, session_id_of
from eu_audit.trace.session import SessionTrace


@dataclass(frozen=True)
class TenantJob:
    """One tenant of one session: the session's run-wide number, its episode, the role and its world."""

    index: int
    episode: Episode
    method: str
    world: World


@dataclass(frozen=True)
class Driven:
    """The agent as a run drives it: the agent, what it can do, and the options it is driven with (the
    agent under test and eu-audit's own floor are each one)."""

    agent: AgentUnderTest
    caps: Capabilities
    opts: AgentRecordOptions


@dataclass(frozen=True)
class Seat:
    """Where one tenant sits in a run: the agent as driven, the tenant's job, its lane of serve, the run's
    real outbox, its opaque name, and the list every text the harness sends it is noted in (``Feeding``)."""

    driven: Driven
    job: TenantJob
    lane: ServeControl
    outbox: Outbox
    tenant: str
    fed: list[tuple[float, str]]
    #: each user turn the harness sent it, with when it was answered (``Feeding``)
    turns: list[UserTurn] = field(default_factory=list)


class Feeding:
    """The agent as one tenant's run sees it: every text the harness sends it (messages, tool results,
    memory records) is noted with the harness's time first, so a model call that quotes a text before it
    was sent shows (``tamper.Tenant.unfed``); and each user turn the agent answered, with when it was
    sent and answered, so a turn that reached the model only on another tenant's lane shows
    (``tamper.check_turns_heard``)."""

    def __init__(self, agent: AgentUnderTest, fed: list[tuple[float, str]], turns: list[UserTurn]) -> None:
        self._agent, self.fed, self.turns = agent, fed, turns

    def send(self, session_id: str, message: Message) -> Turn:
        sent = time.time()
        self.fed.append((sent, message.content or ""))
        turn = self._agent.send(session_id, message)
        if message.role == "user":
            said = bool(turn.text or turn.actions)
            self.turns.append(UserTurn(sent, time.time(), message.content or "", said))
        return turn

    def inject_memory(self, tenant: str, record: MemoryRecord) -> Turn:
        self.fed.append((time.time(), record.text))
        return self._agent.inject_memory(tenant, record)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._agent, name)


def offered_tool(name: str, spec: ToolSpec) -> OfferedTool:
    """A suite tool as the agent is offered it: an OpenAI-style function with typed string/number
    parameters."""
    props = {p: {"type": "number" if t in ("float", "int") else "string"} for p, t in spec.params.items()}
    return OfferedTool(
        function={
            "name": name,
            "description": spec.description,
            "parameters": {"type": "object", "properties": props},
        }
    )


class EpisodeStream:
    """Feeds one tenant one episode in one world, keeping what happens as its ``SessionTrace``."""

    def __init__(self, seat: Seat) -> None:
        job, lane, tenant = seat.job, seat.lane, seat.tenant
        ep, opts, caps = job.episode, seat.driven.opts, seat.driven.caps
        self.fed = seat.fed
        self.agent = cast(
            AgentUnderTest, Feeding(seat.driven.agent, seat.fed, seat.turns)
        )  # every operation goes through it
        self.caps, self.serve, self.outbox, self.opts = caps, lane, seat.outbox, opts
        self.ep, self.tenant = ep, tenant
        self.sid = f"{session_id_of(job.index)}/{job.method}"
        url = lane.model_base_url
        self.lane = {"model_base_url": url} if url and caps.tenant_model_url else {}
        self.view = WorldView(ep, job.world)
        self.env = self.view.environment()
        # the counterfactual world's environment, moved by the same actions: what the observation at tau
        # would have been without z (the hint a forget request brings; A2)
        self.shadow = WorldView(ep, "counterfactual").environment() if self.view.factual else None
        self.observed: dict[int, tuple[str, str | None]] = {}  # t -> (observation, its counterfactual)
        self.toolset = load_toolset(ep.toolset)
        self.tools = [offered_tool(name, self.toolset[name]) for name in ep.tools if name in self.toolset]
        self.matcher = ep.target.matcher()
        self.after = False  # past the forget: blocks from now on are the post-forget manifest
        self.session = ""
        self.trace = SessionTrace(
            session=SessionRecord(
                session_id=self.sid,
                episode_id=ep.id,
                suite=ep.suite,
                transitions=len(ep.steps),
                seed=opts.seed,
                source_id=ep.source_id,
                method=job.method,
                parent_session=session_id_of(job.index),
                tenant=tenant,
                index=job.index,
                episode=ep,
            )
        )

    def add(self, btype: BlockType, t: int, text: str, *, derived: bool = False) -> str:
        """One block of the trace; after the forget it is part of the post-forget manifest."""
        bid = f"b{len(self.trace.blocks)}"
        self.trace.blocks.append(RuntimeBlock(id=bid, type=btype, turn=t, text=text, derived=derived))
        if self.after:
            self.trace.session.final_manifest.append(bid)
        return bid

    def skip(self, t: int, kind: str, reason: str) -> None:
        self.trace.session.skipped.append(SkippedStep(t=t, kind=kind, reason=reason))

    def where(self, t: int, step: Step | None, endpoint: str) -> str:
        what = f"step {t} ({step.kind.value})" if step is not None else endpoint
        return f"episode {self.ep.id}, {self.sid}, {what}"

    def call(self, what: str, fn: Callable[[], Any]) -> Any:
        """An agent operation; its failure's message with the episode's target masked (an agent's error
        body may quote the conversation, and the message reaches CI logs)."""
        try:
            return guarded(what, fn)
        except (AgentFailed, AgentUnreachable) as exc:
            masked = self.matcher.redact(str(exc), "[z]")
            raise type(exc)(masked) from None

    def start(self) -> None:
        self.call(self.where(0, None, "reset"), lambda: self.agent.reset(self.tenant))
        self.session = self.call(
            self.where(0, None, "start"),
            lambda: self.agent.start(self.tenant, seed=self.opts.seed, tools=self.tools, **self.lane),
        )
        for item in self.ep.memory:  # records the tenant holds before the episode (never the target)
            if not self.caps.memory_inject:
                self.skip(0, "memory", f"agent lacks memory_inject: starting record {item.id}")
                continue
            self.add(BlockType.memory, 0, item.text)
            rec = MemoryRecord(id=item.id, text=item.text)
            inject = functools.partial(self.agent.inject_memory, self.tenant, rec)
            self.reply(0, None, self.call(self.where(0, None, "memory"), inject))

    def reply(self, t: int, step: Step | None, turn: Turn, *, pending: bool = False) -> None:
        """Record the agent's turn; answer its tool calls (unless they are a pending plan)."""
        for _ in range(self.opts.max_tool_rounds + 1):
            self.add(BlockType.assistant, t, turn.text, derived=True)
            if not turn.actions:
                return
            results = []
            for a in turn.actions:
                result, record = self.run_tool(t, a.id, a.name, a.arguments, pending=pending)
                self.trace.tool_calls.append(record)
                results.append((a, result))
            if pending:
                return
            for a, result in results:
                msg = Message(
                    role="tool", content=json.dumps(result, sort_keys=True), tool_call_id=a.id, name=a.name
                )
                self.add(BlockType.tool_result, t, msg.content)
                turn = self.call(
                    self.where(t, step, "tool result"),
                    lambda m=msg: self.agent.send(self.session, m),  # type: ignore[misc]
                )

    def run_tool(
        self, t: int, call_id: str, name: str, args: dict[str, Any] | None, *, pending: bool
    ) -> tuple[Any, ToolCallRecord]:
        spec = self.toolset.get(name)
        status: Any = "executed"
        committed, result = False, None
        if spec is None or name not in self.ep.tools:
            status, result = "unknown_tool", {"error": f"unknown tool {name}"}
        elif args is None:
            status, result = "malformed", {"error": "the arguments do not parse"}
        elif pending:
            status = "pending"
        elif spec.consequential and self.view.factual:
            self.outbox.fire(f"{self.sid}:{call_id}", self.sid, name, args)  # the real sink, once
            result, committed = self._run(spec.fn, args), True
            if self.shadow is not None:
                self._run(spec.fn, args, self.shadow)
        else:
            result = self._run(spec.fn, args)  # read-only, or the reference world's consequential call
        record = ToolCallRecord(
            session_id=self.sid,
            call_id=f"{self.sid}:{call_id}",
            turn=t,
            name=name,
            arguments=args,
            raw=json.dumps({"name": name, "arguments": args}),
            consequential=bool(spec and spec.consequential),
            committed=committed,
            status=status,
            result=result,
            block_id=self.trace.blocks[-1].id,
        )
        return result, record

    def _run(
        self, fn: Callable[[dict[str, Any], dict[str, Any]], Any], args: dict[str, Any], env: Any = None
    ) -> Any:
        try:
            return fn(self.env if env is None else env, args)
        except ToolError as exc:
            return {"error": str(exc)}

    def step(self, t: int, step: Step) -> None:
        text = self.view.text(step)
        if step.kind is StepKind.user:
            self.add(BlockType.user, t, text)
            turn = self.call(
                self.where(t, step, "message"),
                lambda: self.agent.send(self.session, Message(role="user", content=text)),
            )
            self.reply(t, step, turn)
        elif step.kind is StepKind.tool:
            assert step.tool is not None
            result = self._run(self.toolset[step.tool].fn, dict(step.args))
            content = json.dumps(result, sort_keys=True)
            if self.shadow is not None:
                cf = json.dumps(
                    self._run(self.toolset[step.tool].fn, dict(step.args), self.shadow), sort_keys=True
                )
                self.observed[t] = (content, cf)
            self.add(BlockType.tool_result, t, content)
            # the scaffold ran this tool, not the agent: no call of the agent's to answer, so it carries an id
            # of its own (an OpenAI-style history needs one; see the contract)
            msg = Message(role="tool", content=content, name=step.tool, tool_call_id=f"scaffold-t{t}")
            self.reply(
                t,
                step,
                self.call(self.where(t, step, "tool result"), lambda: self.agent.send(self.session, msg)),
            )
        elif step.kind is StepKind.memory:
            if not self.caps.memory_inject:
                self.skip(t, step.kind.value, "agent lacks memory_inject")
                return
            rid, mtext, _ = self.view.memory_record(step, t)
            self.add(BlockType.memory, t, mtext)
            rec = MemoryRecord(id=rid, text=mtext)
            self.reply(
                t,
                step,
                self.call(self.where(t, step, "memory"), lambda: self.agent.inject_memory(self.tenant, rec)),
            )
        elif step.kind is StepKind.plan:
            instruction = step.content or INSTRUCTIONS[StepKind.plan]
            self.add(BlockType.user, t, instruction)
            msg = Message(role="user", content=instruction)
            turn = self.call(self.where(t, step, "message"), lambda: self.agent.send(self.session, msg))
            self.reply(t, step, turn, pending=True)
        elif step.kind is StepKind.compact:
            if not self.caps.compact:
                self.skip(t, "compact", "agent lacks compact (compacts on its own)")
                return
            compact = getattr(self.agent, "compact")  # noqa: B009
            turn = self.call(self.where(t, step, "compact"), lambda: compact(self.session))
            self.add(BlockType.summary, t, turn.text, derived=True)
        elif step.kind is StepKind.tool_return:
            self.skip(t, "tool_return", "tool results go with each call")
        else:
            self.skip(t, step.kind.value, "agent-internal: it keeps what it decides")
