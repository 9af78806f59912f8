"""One tenant driven through one episode: its messages, tool calls, memory steps, rechecks and
elicitations, as ``eu-audit gate`` runs them (``eu_audit.blackbox.drive`` runs the tenants)."""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from eu_audit.audits.probes import load_probes, task_request
from eu_audit.blackbox.adapter import AgentFailed, AgentUnderTest, AgentUnreachable
from eu_audit.blackbox.contract import (
    Capabilities,
    MemoryRecord,
    Message,
    OfferedTool,
    StoreDump,
    Turn,
)
from eu_audit.blackbox.forensics import DiskReport, read_files
from eu_audit.blackbox.options import AgentRecordOptions, ProbeKind
from eu_audit.blackbox.recheck import at_forget, lacking, recheck, tool_refusal
from eu_audit.blackbox.residue import snippet, store_residue
from eu_audit.blackbox.serve_control import ServeControl
from eu_audit.blackbox.undeclared import UndeclaredFiles
from eu_audit.episodes import Episode, Step, StepKind
from eu_audit.errors import EuAuditError
from eu_audit.matching import TargetMatcher
from eu_audit.runtime.agent import INSTRUCTIONS
from eu_audit.runtime.memory import Outbox
from eu_audit.runtime.tools import ToolError, load_toolset
from eu_audit.runtime.world import World, WorldView
from eu_audit.trace.blocks import BlockType, RuntimeBlock
from eu_audit.trace.records import (
    ElicitationRecord,
    ResidueRecord,
    SkippedStep,
    ToolCallRecord,
)


@dataclass
class Transcript:
    """One tenant's run as a session trace: every message and reply a block, every action a call."""

    sid: str
    blocks: list[RuntimeBlock] = field(default_factory=list)
    calls: list[ToolCallRecord] = field(default_factory=list)
    skipped: list[SkippedStep] = field(default_factory=list)
    post_forget: list[str] = field(default_factory=list)  # block ids after the forget

    def add(self, btype: BlockType, t: int, text: str, *, derived: bool = False, after: bool = False) -> str:
        bid = f"b{len(self.blocks)}"
        self.blocks.append(RuntimeBlock(id=bid, type=btype, turn=t, text=text, derived=derived))
        if after:
            self.post_forget.append(bid)
        return bid


class Feeding:
    """The agent as one tenant's driver sees it: every text the harness sends it (messages, tool results,
    memory records) is noted with the harness's time first, so a model call that quotes a text before it
    was sent shows (``tamper.Tenant.unfed``)."""

    def __init__(self, agent: AgentUnderTest, fed: list[tuple[float, str]]) -> None:
        self._agent, self.fed = agent, fed

    def send(self, session_id: str, message: Message) -> Turn:
        self.fed.append((time.time(), message.content or ""))
        return self._agent.send(session_id, message)

    def inject_memory(self, tenant: str, record: MemoryRecord) -> Turn:
        self.fed.append((time.time(), record.text))
        return self._agent.inject_memory(tenant, record)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._agent, name)


class Driver:
    """Drives one tenant through one episode in one world."""

    def __init__(
        self,
        agent: AgentUnderTest,
        caps: Capabilities,
        serve: ServeControl,
        outbox: Outbox,
        ep: Episode,
        opts: AgentRecordOptions,
        sid: str,
        world: World,
        tenant: str,
        fed: list[tuple[float, str]] | None = None,
    ) -> None:
        self.fed: list[tuple[float, str]] = [] if fed is None else fed
        self.agent = cast(AgentUnderTest, Feeding(agent, self.fed))
        self.caps, self.serve, self.outbox = caps, serve, outbox
        url = serve.model_base_url
        self.lane = {"model_base_url": url} if url and caps.tenant_model_url else {}
        self.ep, self.opts, self.sid, self.tenant = ep, opts, sid, tenant
        self.view = WorldView(ep, world)
        self.env = self.view.environment()
        # the counterfactual world's environment, moved by the same actions: what the observation at tau
        # would have been without z (the hint a forget request brings; A2)
        self.shadow = WorldView(ep, "counterfactual").environment() if self.view.factual else None
        self.observed: dict[int, tuple[str, str | None]] = {}  # t -> (observation, its counterfactual)
        self.toolset = load_toolset(ep.toolset)
        self.tools = [self._spec(name) for name in ep.tools if name in self.toolset]
        self.tx = Transcript(sid)
        self.matcher = ep.target.matcher()
        self.log_from = serve.position() if serve.url and (caps.store_files or opts.store_paths) else 0
        self.after = False
        self.session = ""
        self.undeclared: UndeclaredFiles | None = None  # the run's look for files the agent did not name
        self.started = time.time()  # this tenant's window opens (a file written since is its doing)

    def _spec(self, name: str) -> OfferedTool:
        spec = self.toolset[name]
        props = {
            p: {
                "type": "string"
                if t in ("str", "address")
                else "number"
                if t in ("float", "int")
                else "string"
            }
            for p, t in spec.params.items()
        }
        return OfferedTool(
            function={
                "name": name,
                "description": spec.description,
                "parameters": {"type": "object", "properties": props},
            }
        )

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
                self.tx.skipped.append(
                    SkippedStep(
                        t=0, kind="memory", reason=f"agent lacks memory_inject: starting record {item.id}"
                    )
                )
                continue
            self.tx.add(BlockType.memory, 0, item.text)
            rec = MemoryRecord(id=item.id, text=item.text)
            inject = functools.partial(self.agent.inject_memory, self.tenant, rec)
            self.reply(0, None, self.call(self.where(0, None, "memory"), inject))

    # -- the stream ----------------------------------------------------------------------------
    def reply(self, t: int, step: Step | None, turn: Turn, *, pending: bool = False) -> None:
        """Record the agent's turn; answer its tool calls (unless they are a pending plan)."""
        for _ in range(self.opts.max_tool_rounds + 1):
            self.tx.add(BlockType.assistant, t, turn.text, derived=True, after=self.after)
            if not turn.actions:
                return
            results = []
            for a in turn.actions:
                result, record = self.run_tool(t, a.id, a.name, a.arguments, pending=pending)
                self.tx.calls.append(record)
                results.append((a, result))
            if pending:
                return
            for a, result in results:
                msg = Message(
                    role="tool", content=json.dumps(result, sort_keys=True), tool_call_id=a.id, name=a.name
                )
                self.tx.add(BlockType.tool_result, t, msg.content, after=self.after)
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
            block_id=self.tx.blocks[-1].id,
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
            self.tx.add(BlockType.user, t, text, after=self.after)
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
            self.tx.add(BlockType.tool_result, t, content, after=self.after)
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
                self.tx.skipped.append(
                    SkippedStep(t=t, kind=step.kind.value, reason="agent lacks memory_inject")
                )
                return
            rid, mtext, _ = self.view.memory_record(step, t)
            self.tx.add(BlockType.memory, t, mtext, after=self.after)
            rec = MemoryRecord(id=rid, text=mtext)
            self.reply(
                t,
                step,
                self.call(self.where(t, step, "memory"), lambda: self.agent.inject_memory(self.tenant, rec)),
            )
        elif step.kind is StepKind.plan:
            instruction = step.content or INSTRUCTIONS[StepKind.plan]
            self.tx.add(BlockType.user, t, instruction, after=self.after)
            msg = Message(role="user", content=instruction)
            turn = self.call(self.where(t, step, "message"), lambda: self.agent.send(self.session, msg))
            self.reply(t, step, turn, pending=True)
        elif step.kind is StepKind.compact:
            if not self.caps.compact:
                self.tx.skipped.append(
                    SkippedStep(t=t, kind="compact", reason="agent lacks compact (compacts on its own)")
                )
                return
            compact = getattr(self.agent, "compact")  # noqa: B009
            turn = self.call(self.where(t, step, "compact"), lambda: compact(self.session))
            self.tx.add(BlockType.summary, t, turn.text, derived=True, after=self.after)
        elif step.kind is StepKind.tool_return:
            self.tx.skipped.append(
                SkippedStep(t=t, kind="tool_return", reason="tool results go with each call")
            )
        else:
            self.tx.skipped.append(
                SkippedStep(t=t, kind=step.kind.value, reason="agent-internal: it keeps what it decides")
            )

    # -- after the stream ----------------------------------------------------------------------
    def say(self, what: str, text: str) -> list[str]:
        """One user turn of a recheck (``recheck.RecheckTarget``): the answers, with any tool call's
        arguments; a tool call is answered with a refusal, never run."""
        where = f"episode {self.ep.id}, {self.sid}, recheck {what}"
        turn = self.call(where, lambda: self.agent.send(self.session, Message(role="user", content=text)))
        answers = [turn.text]
        for _ in range(self.opts.max_tool_rounds):
            if not turn.actions:
                break
            answers += [json.dumps(a.arguments) for a in turn.actions]
            for a in turn.actions:
                msg = Message(role="tool", content=tool_refusal(what), tool_call_id=a.id, name=a.name)
                turn = self.call(where, lambda m=msg: self.agent.send(self.session, m))  # type: ignore[misc]
            answers.append(turn.text)
        return answers

    def rechecks(self, method: str, matcher: TargetMatcher, at_once: bool = False) -> list[ResidueRecord]:
        """The events of ``--recheck`` in order, each followed by the checks: one residue record each
        (the serve-log side is filled in with the others', ``residue.context_residue``). ``at_once``: the
        events checked right after the forget (``at-once``), else the others, after the probes."""
        out = []
        for name in [x for x in self.opts.recheck if at_forget(x) == at_once]:
            why = lacking(name, self.caps)
            if why:
                out.append(ResidueRecord(session_id=self.sid, after=name, skipped=why))
                continue
            self.serve.mark(tenant=self.tenant, phase="recheck", event=name)
            try:
                answers = recheck(name)[0].run(self, name)
            finally:
                self.serve.unmark()
            dump = self.dump(f"recheck {name}, ")
            holding = [a for a in answers if matcher.found_in(a)]
            out.append(
                store_residue(self.sid, dump, matcher).model_copy(
                    update={
                        "after": name,
                        "replies": None if at_once else len(answers),  # at once: nothing was asked
                        "replies_with_z": None if at_once else len(holding),
                        "reply_example": snippet(holding[0], matcher) if holding else "",
                    }
                )
            )
        return out

    def dump(self, when: str = "") -> StoreDump | None:
        """The agent's store dump for the tenant (None: it offers none)."""
        if not self.caps.store_dump:
            return None
        dumped: StoreDump = self.call(
            f"episode {self.ep.id}, {self.sid}, {when}dump", lambda: self.agent.dump(self.tenant)
        )
        return dumped

    def files(self) -> list[str]:
        """The files the agent persists this tenant in: its own list (``files``), else the run's
        ``--store-path`` globs with ``{tenant}`` filled in; [] when neither names any."""
        if self.caps.store_files:
            got = self.call(f"episode {self.ep.id}, {self.sid}, files", lambda: self.agent.files(self.tenant))
            return list(got.paths)
        out: list[str] = []
        for pattern in self.opts.store_paths:
            filled = pattern.replace("{tenant}", self.tenant)
            out += sorted(glob.glob(filled)) or [filled]  # a path that matches nothing is named unread
        return out

    def forensics(self) -> DiskReport | None:
        """eu-audit's own read of the tenant's files (``forensics``); None when no file is named."""
        paths = self.files()
        if not paths:
            return None
        # what the agent wrote and did not name (Linux, an agent on this machine): read too, named apart
        extra = self.undeclared.find(paths, self.started) if self.undeclared is not None else []
        entries, _ = self.serve.log(self.log_from) if self.serve.url else ([], "")
        embedded = [
            text
            for e in entries
            if e.endpoint == "/v1/embeddings" and e.mark is not None and e.mark.tenant == self.tenant
            for text in e.input or []
            if self.matcher.found_in(text)
        ]
        embed = self.serve.embed if self.serve.url else None
        report = read_files(
            [*paths, *extra], self.matcher, embedded=embedded, embed=embed, tenant=self.tenant
        )
        report.undeclared = extra
        return report

    def probe_session(self, what: str) -> tuple[str, Literal["fork", "fresh session"]]:
        if self.caps.fork:
            return self.call(what, lambda: self.agent.fork(self.session)), "fork"
        return self.call(
            what, lambda: self.agent.start(self.tenant, seed=self.opts.seed, tools=self.tools, **self.lane)
        ), "fresh session"

    def ask(self, kind: ProbeKind, name: str, prompt: str, seed: int | None) -> ElicitationRecord:
        what = f"episode {self.ep.id}, {self.sid}, {kind} {name}"
        self.serve.mark(tenant=self.tenant, phase=kind)
        if seed is not None:
            self.serve.sampled(self.opts.temperature, seed)
        try:
            session, where = self.probe_session(what)
            turn = self.call(what, lambda: self.agent.send(session, Message(role="user", content=prompt)))
        finally:
            if seed is not None:
                self.serve.greedy()
        return ElicitationRecord(
            session_id=self.sid, kind=kind, name=name, where=where, prompt=prompt, answer=turn.text, seed=seed
        )

    def elicit(self) -> list[ElicitationRecord]:
        out = []
        for p in load_probes():
            prompt, cue = p.render(self.ep)
            if cue:  # a black box cannot be made to begin its answer: ask for the opening instead
                prompt += f"\nBegin your answer with: {cue}"
            out.append(self.ask("probe", p.id, prompt, None))
        if self.serve.url is None:
            return out  # samples need pinned seeds: not measurable without serve (the audit says so)
        seeds = [_seed(self.opts.seed, self.ep.id, i) for i in range(self.opts.k)]
        for s in seeds:
            out.append(self.ask("sample", "task", task_request(self.ep), s))
        choice = next((x for x in self.ep.steps if x.choices), None)
        if choice is not None:
            for s in seeds:
                out.append(self.ask("choice", "choice", choice.content, s))
        return out


def guarded(what: str, fn: Callable[[], Any]) -> Any:
    """An agent operation, its failure named by the episode and step being driven: an agent that was
    never reachable is bad configuration (exit 2); one that fails while driven, a failed run (exit 3)."""
    try:
        return fn()
    except AgentUnreachable as exc:
        raise AgentUnreachable(f"{what}: {exc}") from None
    except AgentFailed as exc:
        raise AgentFailed(f"{what}: {exc}") from None
    except EuAuditError:
        raise
    except Exception as exc:  # an in-process agent's own error: the run failed, and where
        raise AgentFailed(f"{what}: the agent raised {type(exc).__name__}: {exc}") from exc


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:4], "big")
