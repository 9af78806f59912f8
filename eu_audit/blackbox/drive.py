"""``eu-audit record --agent``: drive suite episodes through an agent eu-audit did not build.

Per episode, two tenants:

1. **agent** (tenant A): the factual stream up to the end of the contamination phase (user turns as
   messages; the agent's tool calls answered from the suite's toolset on eu-audit's environment,
   consequential ones written once to the real outbox; memory steps through the agent's memory
   capability, else skipped with the reason), then **the agent's own forget**, then the episode's
   future turns, then the elicitations: the six probes, k seeded samples of the task probe and, for the
   preference suite, k choices (each on a fork of the session, or a fresh session of the same tenant when
   the agent cannot fork), then its store dump.
2. **b5** (tenant B, fresh): the counterfactual stream (the same script without z), no forget, the same
   future turns, elicitations and dump. This is the floor every figure is compared with.

Everything the audits need is kept in the bundle (messages, replies, actions, the forget receipt as the
agent returned it, the elicitations, and what the serve log and the store dump still hold of z), under
the methods ``agent`` and ``b5``, so ``eu-audit audit`` needs neither the agent nor a model, and gates
read ``agent.leak_probes<=floor``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import secrets
import shutil
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from eu_audit import __version__
from eu_audit.audits.probes import load_probes, task_request
from eu_audit.blackbox.adapter import AgentFailed, AgentUnderTest, AgentUnreachable, Bounds, open_agent
from eu_audit.blackbox.contract import (
    Capabilities,
    ForgetHint,
    ForgetRequest,
    MemoryRecord,
    Message,
    StoreDump,
    ToolSpec,
    Turn,
)
from eu_audit.blackbox.facts import AgentRunFacts
from eu_audit.blackbox.recheck import at_forget, lacking, recheck, tool_refusal
from eu_audit.blackbox.residue import context_residue, snippet, store_residue
from eu_audit.blackbox.serve_api import CONTROL_HEADER, DEFAULT_CONTROL_FILE, key_id, read_control_file
from eu_audit.bundle.io import write_bundle
from eu_audit.checkpoints import CheckpointPolicy
from eu_audit.episodes import Episode, Phase, Step, StepKind
from eu_audit.errors import BadInput, EuAuditError, RunFailed
from eu_audit.http import HttpFailure, request_json
from eu_audit.matching import TargetMatcher
from eu_audit.record import ProgressCounter, pick_episodes
from eu_audit.runtime.agent import INSTRUCTIONS
from eu_audit.runtime.memory import Outbox
from eu_audit.runtime.tools import ToolError, load_toolset
from eu_audit.runtime.world import World, WorldView
from eu_audit.shards import Shard
from eu_audit.suites import load_suite
from eu_audit.trace.blocks import BlockType, RuntimeBlock
from eu_audit.trace.records import (
    BLACK_BOX_ENGINE,
    AgentForgetRecord,
    Decoding,
    ElicitationRecord,
    Header,
    ModelInfo,
    ResidueRecord,
    SessionRecord,
    SkippedStep,
    TargetInfo,
    ToolCallRecord,
)
from eu_audit.trace.session import Bundle, SessionTrace

Progress = Callable[[str, int, int], None]
#: the tenants of one session: the agent (its forget), the reference B5 (never fed z), and the positive
#: control B0 (driven like the agent, never sent the forget: what each channel holds without a forget)
METHODS: tuple[tuple[str, World], ...] = (("agent", "factual"), ("b5", "counterfactual"))
CONTROL_TENANT: tuple[str, World] = ("b0", "factual")
Kind = Literal["probe", "sample", "choice"]


@dataclass
class AgentRecordOptions:
    agent: str  # http://host:port or module:factory
    out: Path = Path("trace.jsonl")
    suite: str = "builtin"
    n: int | None = None
    seed: int = 0
    serve: str | None = None  # the eu-audit serve the agent's model calls go through
    k: int = 5  # samples of the task probe (and choices) per state
    temperature: float = 0.7
    max_tool_rounds: int = 3  # tool call -> result -> reply rounds per message
    state_dir: Path | None = None  # the outbox (default: <out>.state/)
    force: bool = False
    serve_control: Path = Path(DEFAULT_CONTROL_FILE)  # where serve wrote its control secret
    keep_state: bool = False  # keep the state folder of a failed run
    hint: bool = False  # send the sanitized text with the forget (the reference's input: see _hint)
    shard: Shard | None = None  # drive only this shard's sessions (ids stay run-wide)
    bounds: Bounds = field(default_factory=Bounds)
    concurrency: int = 1  # tenants driven at the same time, each on its own lane of serve
    #: events after the forget, each followed by the checks again (``recheck.parse_rechecks``)
    recheck: tuple[str, ...] = ()
    #: drive a third tenant per session like the agent's but never send it the forget (``CONTROL_TENANT``):
    #: every rule's and channel's positive control; about half again the run's time
    positive_control: bool = True


class ServeControl:
    """The harness's hold on ``eu-audit serve``: marks, pinned decoding, the log. Every control call
    carries the run's secret (read from the file serve wrote); the agent under test never has it."""

    def __init__(self, url: str | None, secret: str = "", lane: str | None = None) -> None:
        self.url = url.rstrip("/") if url else None
        self.secret = secret
        self.key = key_id(secret) if secret else ""
        self.lane = lane  # None: the root lane, every model call of a run driven one tenant at a time

    def _call(self, path: str, body: Any = None) -> Any:
        if self.url is None:
            return None
        try:
            return request_json(
                self.url + path,
                "POST" if body is not None else "GET",
                body,
                timeout=60,
                headers={CONTROL_HEADER: self.secret},
                max_bytes=1 << 30,  # the log: every prompt of the run
            )
        except HttpFailure as exc:
            raise RunFailed(f"eu-audit serve at {self.url}: {exc}") from None

    def info(self) -> dict[str, Any]:
        if self.url is None:
            return {}
        try:
            got = dict(self._call("/eu-audit/v1/info"))
        except RunFailed as exc:
            raise BadInput(f"--serve {self.url} is not an eu-audit serve that answers: {exc}") from None
        if got.get("control_key") != self.key:
            raise BadInput(
                f"--serve-control: this secret (key {self.key}) is not the one {self.url} was started with "
                f"(key {got.get('control_key')}); give the --control-file that serve wrote"
            )
        return got

    def mark(self, **tag: Any) -> None:
        self._call("/eu-audit/v1/mark", {"tag": tag, "lane": self.lane})

    def unmark(self) -> None:
        """Calls from now on belong to no tenant (a tenant's run is over)."""
        self._call("/eu-audit/v1/mark", {"tag": None, "lane": self.lane})

    def greedy(self) -> None:
        self._call("/eu-audit/v1/decoding", {"mode": "greedy", "lane": self.lane})

    def sampled(self, temperature: float, seed: int) -> None:
        body = {"mode": "sampled", "temperature": temperature, "seed": seed, "lane": self.lane}
        self._call("/eu-audit/v1/decoding", body)

    def for_tenant(self) -> ServeControl:
        """A fresh lane of serve for one tenant (its own marks and pinned decoding): the agent is told to
        send that tenant's model calls to ``model_base_url``, so calls of tenants driven at the same time
        are told apart by where they arrive."""
        return ServeControl(self.url, self.secret, secrets.token_hex(16))

    @property
    def model_base_url(self) -> str | None:
        if self.url is None or self.lane is None:
            return None
        return f"{self.url}/lanes/{self.lane}/v1"

    def log(self) -> tuple[list[dict[str, Any]], str]:
        got = self._call("/eu-audit/v1/log?since=0")
        return (list(got.get("entries", [])), str(got.get("digest", ""))) if got else ([], "")


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
    ) -> None:
        self.agent, self.caps, self.serve, self.outbox = agent, caps, serve, outbox
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
        self.after = False
        self.session = ""

    def _spec(self, name: str) -> ToolSpec:
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
        return ToolSpec(
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
        return guarded(what, fn)

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
        """One user turn of a recheck (``recheck.Target``): the answers, with any tool call's arguments;
        a tool call is answered with a refusal, never run."""
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
            self.serve.mark(session=self.sid, method=method, tenant=self.tenant, phase="recheck", event=name)
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

    def probe_session(self, what: str) -> tuple[str, Literal["fork", "fresh session"]]:
        if self.caps.fork:
            return self.call(what, lambda: self.agent.fork(self.session)), "fork"
        return self.call(
            what, lambda: self.agent.start(self.tenant, seed=self.opts.seed, tools=self.tools, **self.lane)
        ), "fresh session"

    def ask(self, kind: Kind, name: str, prompt: str, seed: int | None) -> ElicitationRecord:
        what = f"episode {self.ep.id}, {self.sid}, {kind} {name}"
        self.serve.mark(session=self.sid, method=self.sid.split("/")[-1], tenant=self.tenant, phase=kind)
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


def _split(ep: Episode) -> tuple[list[tuple[int, Step]], list[tuple[int, Step]]]:
    """(the stream before the forget, the future turns after it)."""
    steps = list(enumerate(ep.steps, 1))
    return [x for x in steps if x[1].phase is not Phase.further], [
        x for x in steps if x[1].phase is Phase.further
    ]


def _hint(ep: Episode, observed: dict[int, tuple[str, str | None]], sanitized: bool) -> ForgetHint:
    """The flagged observation as the agent received it and, with ``sanitized`` (``--hint``), without z.
    The sanitized text is exactly what the reference tenant was fed, so an agent that replays with it
    matches the reference by construction: gates send it only when asked, and the bundle says so."""
    src = ep.steps[ep.tau - 1]
    if ep.tau in observed:  # a tool result: its text in both worlds, as the harness produced them
        text, cf = observed[ep.tau]
        return ForgetHint(source_text=text, sanitized=cf if sanitized else None)
    return ForgetHint(source_text=src.content or None, sanitized=src.counterfactual if sanitized else None)


def hint_sent(opts: AgentRecordOptions) -> str:
    return "source text and its sanitized text (--hint)" if opts.hint else "source text only"


def run_tenant(
    agent: AgentUnderTest,
    caps: Capabilities,
    serve: ServeControl,
    outbox: Outbox,
    ep: Episode,
    opts: AgentRecordOptions,
    sid: str,
    method: str,
    world: World,
    tenant: str,
) -> tuple[SessionTrace, list[SkippedStep]]:
    d = Driver(agent, caps, serve, outbox, ep, opts, f"{sid}/{method}", world, tenant)
    # marked before the agent hears of the tenant: on a lane, this opens it
    serve.mark(session=d.sid, method=method, tenant=tenant, phase="stream")
    d.start()
    before, future = _split(ep)
    for t, step in before:
        d.step(t, step)
    forgets: list[AgentForgetRecord] = []
    at_once: list[ResidueRecord] = []
    if method == "agent":
        request = ForgetRequest(
            target=ep.target.value, variants=ep.target.variants, hint=_hint(ep, d.observed, opts.hint)
        )
        t0 = time.perf_counter()
        got = d.call(f"episode {ep.id}, {d.sid}, forget", lambda: agent.forget(tenant, request))
        forgets.append(
            AgentForgetRecord(
                session_id=d.sid,
                status=got.status,
                detail=got.detail,
                receipt=got.receipt,
                wall_s=round(time.perf_counter() - t0, 3),
            )
        )
        if got.status in ("unsupported", "error"):
            raise AgentFailed(
                f"episode {ep.id}, {d.sid}, forget: the agent answered {got.status}: {got.detail}"
            )
        # before any later turn can evict what the forget left (--recheck at-once)
        at_once = d.rechecks(method, TargetMatcher.of(ep.target.value, ep.target.variants), at_once=True)
    d.after = True
    serve.mark(session=d.sid, method=method, tenant=tenant, phase="future")
    for t, step in future:
        d.step(t, step)
    elicitations = d.elicit()
    serve.unmark()  # what the agent does after this (its dump, another tenant) is not this tenant's
    dump = d.dump()
    session = SessionRecord(
        session_id=d.sid,
        episode_id=ep.id,
        suite=ep.suite,
        transitions=len(ep.steps),
        seed=opts.seed,
        target=TargetInfo(value=ep.target.value, variants=ep.target.variants, kind=ep.target.kind),
        source_id=ep.source_id,
        final_manifest=d.tx.post_forget,
        method=method,
        parent_session=sid,
        skipped=d.tx.skipped,
        episode=ep,
    )
    trace = SessionTrace(session=session, blocks=d.tx.blocks, tool_calls=d.tx.calls)
    trace.elicitations = elicitations
    trace.agent_forgets = forgets
    trace.residues = [store_residue(d.sid, dump, trace.matcher())]
    if method == "agent":  # forgets that come back: the reference never held z, nothing to recheck
        trace.residues += at_once + d.rechecks(method, trace.matcher())
    return trace, d.tx.skipped


def _drive_all(
    jobs: list[tuple[int, Episode, str, World]],
    drive_one: Callable[[tuple[int, Episode, str, World]], SessionTrace],
    opts: AgentRecordOptions,
) -> list[SessionTrace]:
    """Every tenant's trace, in the jobs' order: one after another, or ``opts.concurrency`` at a time (the
    first failure cancels the tenants not yet started and is raised as it is)."""
    size = 0

    def kept(trace: SessionTrace) -> SessionTrace:
        nonlocal size
        size += sum(len(r.model_dump_json()) + 1 for r in trace.records())
        if size > opts.bounds.bundle_bytes:
            raise AgentFailed(
                f"{trace.session_id}: the bundle would be over {opts.bounds.bundle_bytes >> 20} MiB "
                "(--max-bundle-mb); the agent's answers are too large to keep"
            )
        return trace

    if opts.concurrency <= 1:
        return [kept(drive_one(job)) for job in jobs]
    pool = ThreadPoolExecutor(max_workers=opts.concurrency, thread_name_prefix="eu-audit-tenant")
    try:
        futures = [pool.submit(drive_one, job) for job in jobs]
        return [kept(f.result()) for f in futures]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _check_concurrency(opts: AgentRecordOptions, serve: ServeControl, caps: Capabilities) -> None:
    """Tenants at the same time are told apart by serve's lanes: that needs serve and an agent that
    sends each tenant's model calls where it is told (refused before any tenant runs)."""
    if opts.concurrency < 1:
        raise BadInput("--concurrency must be at least 1")
    if opts.concurrency == 1:
        return
    if serve.url is None:
        raise BadInput("--concurrency needs --serve: serve's lanes are what tell tenants' model calls apart")
    if not caps.tenant_model_url:
        raise BadInput(
            f"--concurrency {opts.concurrency}: agent {opts.agent} does not take a model URL per tenant "
            "(capabilities.tenant_model_url is false), so its tenants' model calls could not be told "
            "apart; drive it one tenant at a time (--concurrency 1) or shard the run (--shard I/N)"
        )


def _unattributed(entries: list[dict[str, Any]], since: int, run: str) -> int:
    """Model calls since ``since`` that no tenant of run ``run`` owns: in a concurrent run only a lane's
    calls carry this run's marks, so these arrived somewhere else (serve's root URL)."""
    model = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
    return sum(
        1
        for e in entries[since:]
        if e.get("endpoint") in model
        and not str((e.get("mark") or {}).get("tenant", "")).startswith(f"{run}-")
    )


def _header(
    opts: AgentRecordOptions, info: dict[str, Any], caps: Capabilities, digest: str, key: str
) -> Header:
    """A black-box bundle's header: the model serve ran, and the run's typed facts (``AgentRunFacts``)."""
    return Header(
        tool_version=__version__,
        model=ModelInfo(
            name=str(info.get("model", "unknown")),
            weight_digest=str(info.get("weight_digest", "")),
            chat_template_digest="",
            chat_format="",
            dtype=str(info.get("engine", "unknown")),
        ),
        engine=BLACK_BOX_ENGINE,
        engine_facts=AgentRunFacts(
            agent=opts.agent,
            capabilities=caps,
            serve=opts.serve,
            serve_info=info,
            serve_log_digest=digest,
            serve_control_key=key,
            forget_hint=hint_sent(opts),
            shard=str(opts.shard) if opts.shard else None,
            k=opts.k,
            temperature=opts.temperature,
            concurrency=opts.concurrency,
        ).engine_facts(),
        decoding=Decoding(temperature=0.0, max_tokens=0),
        seed=opts.seed,
        suite=opts.suite,
        checkpoint_policy=CheckpointPolicy.every_turn,
    )


def record_agent(opts: AgentRecordOptions, progress: Progress | None = None) -> tuple[Bundle, Path]:
    out = Path(opts.out)
    if out.exists() and not opts.force:
        raise BadInput(f"{out} exists; pass --force to replace it (eu-audit never overwrites silently)")
    episodes = [
        ep
        for ref in opts.suite.split(",")
        if ref.strip()
        for ep in pick_episodes(load_suite(ref.strip()), opts.n)
    ]
    chosen = opts.shard.select(episodes) if opts.shard else list(enumerate(episodes))
    if not chosen:
        raise BadInput(f"--shard {opts.shard}: no session of the {len(episodes)} falls in this shard")
    serve = ServeControl(opts.serve, read_control_file(opts.serve_control) if opts.serve else "")
    info = serve.info()
    agent = open_agent(opts.agent, opts.bounds)
    caps = guarded(f"agent {opts.agent}, capabilities", agent.capabilities)
    _check_concurrency(opts, serve, caps)
    start_seq = len(serve.log()[0]) if opts.concurrency > 1 else 0
    state_dir = opts.state_dir or out.with_name(out.name + ".state")
    made_state = not state_dir.exists()
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    outbox = Outbox(state_dir / "outbox.sqlite")
    run = uuid.uuid4().hex[:8]
    tenants = [*METHODS, CONTROL_TENANT] if opts.positive_control else list(METHODS)
    jobs = [(i, ep, method, world) for i, ep in chosen for method, world in tenants]
    counter = ProgressCounter(len(jobs), progress)

    def drive_one(job: tuple[int, Episode, str, World]) -> SessionTrace:
        i, ep, method, world = job
        lane = serve.for_tenant() if opts.concurrency > 1 else serve
        trace, _ = run_tenant(
            agent, caps, lane, outbox, ep, opts, f"s{i}", method, world, f"{run}-s{i}-{method}"
        )
        counter.tick(f"s{i} {method} {ep.id}")
        return trace

    try:
        sessions = _drive_all(jobs, drive_one, opts)
        entries, digest = serve.log()
        stray = _unattributed(entries, start_seq, run) if opts.concurrency > 1 else 0
        if stray:
            raise AgentFailed(
                f"the agent sent {stray} model call(s) to serve's root URL while tenants ran at the same "
                "time: no tenant can be held to them. It must send each tenant's calls to the "
                "model_base_url it was started with (or run with --concurrency 1)"
            )
    except BaseException:
        outbox.close()
        if made_state and not opts.keep_state:
            shutil.rmtree(state_dir, ignore_errors=True)
        raise
    outbox.close()
    for trace in sessions:
        trace.residues = [
            context_residue(r, entries, trace, digest, serve.url is not None, serve.key, run)
            for r in trace.residues
        ]
    if progress:
        progress("written", len(jobs), len(jobs))
    header = _header(opts, info, caps, digest, serve.key)
    bundle = Bundle(header=header, sessions=sessions, path=out)
    write_bundle(out, bundle.records())
    return bundle, out
