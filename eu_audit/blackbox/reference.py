"""eu-audit's own runtime as an agent under test: the passing control of a black-box gate.

It speaks the agent contract (``contract.py``), keeps every session as eu-audit's runtime does (blocks with
provenance, metadata checkpoints, a KV state), asks for its model turns through the ``openai`` engine
(point it at ``eu-audit serve``, so every model call is in the serve log), and lets its host run the
tools it calls. Its forget is one of:

- ``b7``: selective replay (Algorithm 1). Every open session of the tenant that saw the target is
  restored to the last checkpoint before the target's observation and the suffix is re-enacted with that
  observation sanitized (the hint's sanitized text when the request brings one, else the observation
  with every variant of the target cut out); the tenant's persistent records that hold the target are
  rewritten the same way. Tool results after the target are the recorded ones (A2).
- ``b1``: what deployed stacks do: delete the persistent memory records that hold the target; the
  sessions stay as they are.
- ``b0``: a forget switched off: it answers ok and changes nothing (the no-op a gate must never pass).

Run it over HTTP with ``eu-audit agent --forget b7 --serve URL --port N``, or in-process with
``--agent eu_audit.blackbox.reference:from_env`` (settings from ``EU_AUDIT_AGENT_*`` variables).
"""

from __future__ import annotations

import copy
import itertools
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from eu_audit.blackbox.contract import (
    Action,
    Capabilities,
    ForgetReceipt,
    ForgetRequest,
    MemoryRecord,
    Message,
    OfferedTool,
    StoredItem,
    StoreDump,
    StoreFiles,
    Turn,
)
from eu_audit.checkpoints import CheckpointStore
from eu_audit.defaults import TURN_MAX_TOKENS
from eu_audit.engines import KVEngine
from eu_audit.engines.served import OpenAIEngine, Server
from eu_audit.episodes import Episode, Phase, Step, StepKind, Target
from eu_audit.errors import BadInput
from eu_audit.matching import TargetMatcher
from eu_audit.models import FAST_MODEL
from eu_audit.replay import recorded_fixed_turns, replay_suffix
from eu_audit.runtime.agent import Agent, AgentSettings, ReplayInputs
from eu_audit.runtime.chat import detect_chat_format
from eu_audit.runtime.memory import MemoryStore, Outbox
from eu_audit.runtime.tools import ToolSpec as RuntimeTool
from eu_audit.trace.session import SessionTrace

ForgetKind = Literal["b7", "b1", "b0"]
FORGET_KINDS: tuple[ForgetKind, ...] = ("b7", "b1", "b0")


def runtime_tools(specs: list[OfferedTool]) -> dict[str, RuntimeTool]:
    """The host's OpenAI function specs as runtime tool specs (names and descriptions; the host runs them)."""
    out = {}
    for spec in specs:
        fn = spec.function
        params = {
            p: str(v.get("type", "any"))
            for p, v in (fn.get("parameters") or {}).get("properties", {}).items()
        }
        out[fn["name"]] = RuntimeTool(name=fn["name"], description=fn.get("description", ""), params=params)
    return out


@dataclass
class LiveSession:
    session_id: str
    tenant: str
    agent: Agent
    episode: Episode  # the script so far: one step per message the session received
    tools: dict[str, RuntimeTool]
    seed: int
    calls: dict[str, str] = field(default_factory=dict)  # action id -> tool name


class ReferenceAgent:
    """The contract's Python protocol over eu-audit's runtime."""

    def __init__(
        self,
        engine: KVEngine,
        *,
        forget: ForgetKind = "b7",
        state_dir: Path | None = None,
        max_tokens: int = TURN_MAX_TOKENS,
    ) -> None:
        if forget not in FORGET_KINDS:
            raise BadInput(f"forget must be one of {', '.join(FORGET_KINDS)}, not {forget!r}")
        self.engine, self.forget_kind, self.max_tokens = engine, forget, max_tokens
        self.chat = detect_chat_format(engine.tokenizer)
        path = (state_dir / "memory.sqlite") if state_dir else Path(":memory:")
        self.memory = MemoryStore(path)  # per tenant: the agent's persistent memory
        self.outbox = Outbox(Path(":memory:"))  # the host runs tools: nothing fires here
        self.sessions: dict[str, LiveSession] = {}
        self._ids = itertools.count()
        self._lock = threading.RLock()  # the registries below; a tenant's work holds its own lock
        self._tenant_locks: dict[str, threading.RLock] = {}
        self._engines: dict[str, KVEngine] = {}  # tenant -> its engine on serve's lane for it

    # -- the contract --------------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        return Capabilities(
            name=f"eu-audit reference agent (forget = {self.forget_kind})",
            fork=True,
            memory_inject=True,
            store_dump=True,
            compact=True,
            tenant_model_url=isinstance(self.engine, OpenAIEngine),
        )

    def _tenant(self, tenant: str) -> threading.RLock:
        """One tenant's lock: tenants run side by side, each on its own lane of serve."""
        with self._lock:
            return self._tenant_locks.setdefault(tenant, threading.RLock())

    def _of(self, tenant: str) -> list[LiveSession]:
        with self._lock:
            return [s for s in self.sessions.values() if s.tenant == tenant]

    def _engine(self, tenant: str) -> KVEngine:
        with self._lock:
            return self._engines.get(tenant, self.engine)

    def _use_lane(self, tenant: str, model_base_url: str) -> None:
        """Every later model call of ``tenant`` goes to ``model_base_url`` (serve's lane for it)."""
        if not isinstance(self.engine, OpenAIEngine) or not model_base_url.rstrip("/").endswith("/v1"):
            raise BadInput(
                f"model_base_url {model_base_url!r}: expected an eu-audit serve lane ending in /v1"
            )
        e = self.engine
        root = model_base_url.rstrip("/")[: -len("/v1")]
        lane = OpenAIEngine(
            e.loaded,
            Server(root),
            model_id=e.model_id,
            dialect=e.dialect,
            schedule=e.schedule,
            info=e.server_facts,
        )
        with self._lock:
            self._engines[tenant] = lane

    def _new_agent(
        self,
        tenant: str,
        episode: Episode,
        tools: dict[str, RuntimeTool],
        seed: int,
        memory: MemoryStore | None = None,
        **kw: Any,
    ) -> Agent:
        settings = AgentSettings(max_tokens=self.max_tokens, seed=seed, host_tools=True, **kw)
        store = self.memory if memory is None else memory
        return Agent(
            self._engine(tenant).sibling(),
            self.chat,
            episode,
            tenant,
            settings,
            store,
            self.outbox,
            tools=tools,
        )

    def start(
        self, tenant: str, *, seed: int, tools: list[OfferedTool], model_base_url: str | None = None
    ) -> str:
        if model_base_url:
            self._use_lane(tenant, model_base_url)
        with self._tenant(tenant):
            with self._lock:
                sid = f"{tenant}~{next(self._ids)}"
            specs = runtime_tools(tools)
            episode = Episode.model_construct(
                id=sid,
                suite="live",
                toolset="host",
                tools=list(specs),
                memory=[],
                env={},
                counterfactual_env=None,
                target=Target(value=""),
                steps=[],
                meta={"live": True},
                system=None,
                description="",
                checkpoint_policy=None,
                format="eu-audit/episode@1",
            )
            agent = self._new_agent(tenant, episode, specs, seed)
            agent.start()
            with self._lock:
                self.sessions[sid] = LiveSession(sid, tenant, agent, episode, specs, seed)
            return sid

    def _session(self, session_id: str) -> LiveSession:
        with self._lock:
            live = self.sessions.get(session_id)
        if live is None:
            raise BadInput(f"no session {session_id!r}")
        return live

    def _step(self, live: LiveSession, step: Step) -> Turn:
        live.episode.steps.append(step)
        turn = live.agent.step(step)
        actions = []
        for call in live.agent.tool_calls:
            if (
                call.turn == live.agent.t
                and call.block_id
                and call.status in ("requested", "unknown_tool", "malformed")
            ):
                aid = f"{call.call_id}"
                live.calls[aid] = call.name
                actions.append(Action(id=aid, name=call.name, arguments=call.arguments))
        return Turn(text=turn.text, actions=actions)

    def send(self, session_id: str, message: Message) -> Turn:
        live = self._session(session_id)
        with self._tenant(live.tenant):
            if message.role == "user":
                return self._step(
                    live, Step(kind=StepKind.user, phase=Phase.further, content=message.content)
                )
            return self._step(
                live, Step(kind=StepKind.tool_return, phase=Phase.further, content=message.content)
            )

    def fork(self, session_id: str) -> str:
        """A copy of the session's state (its cache rebuilt from the recorded ids): probing it never
        changes the original."""
        live = self._session(session_id)
        with self._tenant(live.tenant):
            with self._lock:
                sid = f"{live.tenant}~{next(self._ids)}"
            episode = live.episode.model_copy(deep=True)
            # a scratch store: restoring a fork rebuilds memory from the script, which must never write
            # back into the tenant's persistent store (a deleted record would come back)
            agent = self._new_agent(
                live.tenant,
                episode,
                live.tools,
                live.seed,
                memory=MemoryStore(Path(":memory:")),
                world=live.agent.settings.world,
            )
            trace = live.agent.trace()
            from eu_audit.checkpoints import Checkpoint, CheckpointReason, manifest_at

            here = Checkpoint(
                id="fork",
                boundary=live.agent.t,
                reasons=[CheckpointReason.turn],
                token_offset=0,
                cache_handle="",
                env_snapshot_id="",
                manifest=manifest_at(trace.blocks, live.agent.t),
            )
            agent.resume(trace, here, held=[])
            with self._lock:
                self.sessions[sid] = LiveSession(sid, live.tenant, agent, episode, live.tools, live.seed)
            return sid

    def inject_memory(self, tenant: str, record: MemoryRecord) -> Turn:
        with self._tenant(tenant):
            live = self._latest(tenant)
            if live is None:  # no session yet: the record waits in the store for the next one
                self.memory.add(tenant, record.id, record.text, [])
                return Turn(text="")
            step = Step(kind=StepKind.memory, phase=Phase.further, content=record.text, memory_id=record.id)
            return self._step(live, step)

    def compact(self, session_id: str) -> Turn:
        live = self._session(session_id)
        with self._tenant(live.tenant):
            return self._step(live, Step(kind=StepKind.compact, phase=Phase.further))

    def _latest(self, tenant: str) -> LiveSession | None:
        own = self._of(tenant)
        return own[-1] if own else None

    def reset(self, tenant: str) -> None:
        with self._tenant(tenant):
            with self._lock:
                for sid in [s for s, live in self.sessions.items() if live.tenant == tenant]:
                    del self.sessions[sid]
            for rid, _, _ in self.memory.records(tenant):
                self.memory.delete(tenant, rid)

    def restart(self, tenant: str) -> None:
        """Not offered: its sessions (blocks, checkpoints, KV state) live in this process only, so a real
        restart would lose them rather than load them back (``capabilities().restart`` is false)."""
        raise NotImplementedError("restart")

    def reindex(self, tenant: str) -> None:
        """Not offered: it derives no index from its records (its memory is searched as stored)."""
        raise NotImplementedError("reindex")

    def files(self, tenant: str) -> StoreFiles:
        """Not offered: it persists nothing to disk (memory, sessions and KV state live in this process),
        so there is nothing below its dump to read."""
        raise NotImplementedError("files")

    def dump(self, tenant: str) -> StoreDump:
        """The tenant's persistent memory and every session's context (what the agent keeps)."""
        with self._tenant(tenant):
            items = [
                StoredItem(store="memory", id=rid, text=text) for rid, text, _ in self.memory.records(tenant)
            ]
            for live in self._of(tenant):
                resident = set(live.agent.manifest)
                for b in live.agent.blocks:
                    if b.id in resident:
                        items.append(StoredItem(store="context", id=f"{live.session_id}:{b.id}", text=b.text))
            return StoreDump(items=items)

    # -- forget --------------------------------------------------------------------------------
    def forget(self, tenant: str, request: ForgetRequest) -> ForgetReceipt:
        with self._tenant(tenant):
            matcher = TargetMatcher.of(request.target, request.variants)
            if not matcher.usable:
                return ForgetReceipt(status="error", detail="the target has no usable string")
            if self.forget_kind == "b0":
                return ForgetReceipt(status="ok", detail="forget switched off: nothing changed")
            deleted = []
            for rid, text, _ in self.memory.records(tenant):
                if matcher.found_in(text):
                    if self.forget_kind == "b1":
                        self.memory.delete(tenant, rid)
                    else:
                        self.memory.add(tenant, rid, matcher.redact(text, ""), [])
                    deleted.append(rid)
            if self.forget_kind == "b1":
                return ForgetReceipt(
                    status="ok", detail="memory records deleted", receipt={"deleted": deleted}
                )
            replayed = {}
            for live in self._of(tenant):
                n = self._replay(live, matcher, request)
                if n is not None:
                    replayed[live.session_id] = n
            return ForgetReceipt(
                status="ok",
                detail="selective replay of every session that saw the target; memory records rewritten",
                receipt={"rewritten_records": deleted, "replayed_transitions": replayed},
            )

    def _replay(self, live: LiveSession, matcher: TargetMatcher, request: ForgetRequest) -> int | None:
        """Algorithm 1 on a live session; returns the transitions re-enacted (None: it never saw z)."""
        trace = live.agent.trace()
        entry = next(
            (
                b
                for b in sorted(trace.blocks, key=lambda b: b.turn)
                if b.turn > 0 and not b.derived and matcher.found_in(b.text)
            ),
            None,
        )
        if entry is None:
            return None
        tau = entry.turn
        step = live.episode.steps[tau - 1]
        hint = request.hint
        sanitized = (
            hint.sanitized
            if hint is not None
            and hint.sanitized is not None
            and hint.source_text is not None
            and TargetMatcher.of(hint.source_text).found_in(step.content)
            else matcher.redact(step.content, "")
        )
        if matcher.found_in(sanitized):
            sanitized = matcher.redact(sanitized, "")  # a hint that still holds z is not a sanitized text
        episode = live.episode.model_copy(deep=True)
        episode.steps[tau - 1] = step.model_copy(
            update={"counterfactual": sanitized, "source": f"src-t{tau}"}
        )
        episode.target = Target(value=request.target, variants=list(request.variants))
        store = CheckpointStore()
        store.items = list(trace.checkpoints)
        c_star = store.latest_before(tau)
        replay = ReplayInputs(recorded_calls=trace.tool_calls, fixed_turns=recorded_fixed_turns(trace))
        settings = AgentSettings(
            max_tokens=self.max_tokens,
            seed=live.seed,
            host_tools=True,
            world="counterfactual",
            shadow_consequential=True,
        )
        agent = Agent(
            self._engine(live.tenant).sibling(),
            self.chat,
            episode,
            live.tenant,
            settings,
            self.memory,
            self.outbox,
            replay=replay,
            tools=live.tools,
        )
        stats = replay_suffix(agent, _as_trace(trace, episode), c_star, tau - 1, held=[])
        live.agent, live.episode = agent, episode
        return stats.transitions


def _as_trace(trace: SessionTrace, episode: Episode) -> SessionTrace:
    t = copy.copy(trace)
    t.session = trace.session.model_copy(update={"episode": episode})
    return t


def from_env() -> ReferenceAgent:
    """``--agent eu_audit.blackbox.reference:from_env``: the reference agent in the harness's process,
    its model at ``EU_AUDIT_AGENT_SERVE`` (an eu-audit serve URL), its forget ``EU_AUDIT_AGENT_FORGET``."""
    from eu_audit.engines import open_engine

    url = os.environ.get("EU_AUDIT_AGENT_SERVE")
    if not url:
        raise BadInput("set EU_AUDIT_AGENT_SERVE to the eu-audit serve URL the reference agent talks to")
    model = os.environ.get("EU_AUDIT_AGENT_MODEL", FAST_MODEL)
    engine = open_engine("openai", model, server=url)
    return ReferenceAgent(engine, forget=os.environ.get("EU_AUDIT_AGENT_FORGET", "b7"))  # type: ignore[arg-type]
