"""Tool dispatch: what happens to a tool call the model writes (ReplayTools, Algorithm 1 line 8).

One decision per call, in this order: a sink policy may block it (B8, B9); an unknown tool or unparsable
arguments are recorded as such; a pending plan is recorded and not run; a consequential call during
replay is shadow-executed (computed on the agent's environment copy, never sent to the real outbox) and
deduplicated by call id (a call that already fired, by the record or by the real outbox, takes its
recorded result and never fires again); a consequential call while recording fires once into the
outbox after a checkpoint; a read-only call runs on the environment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from eu_audit.runtime.memory import Outbox
from eu_audit.runtime.tools import ToolError, ToolSpec
from eu_audit.trace.records import SinkPolicy, ToolCallRecord

CallStatus = Literal["executed", "pending", "shadowed", "blocked", "malformed", "unknown_tool", "requested"]
BLOCKED = {"error": "blocked by the sink policy: a tainted value in an identifier argument"}


@dataclass(frozen=True)
class CallOutcome:
    status: CallStatus
    result: Any = None
    committed: bool = False

    @property
    def returns(self) -> bool:
        """Does the model see a result for this call in the next tool_return observation?"""
        return self.status in ("executed", "shadowed", "blocked")


class ToolDispatcher:
    def __init__(
        self,
        tools: Mapping[str, ToolSpec],
        outbox: Outbox,
        *,
        shadow: bool = False,
        sink_policy: SinkPolicy | None = None,
        recorded_calls: Sequence[ToolCallRecord] = (),
        host: bool = False,
    ) -> None:
        self.tools = tools
        self.outbox = outbox
        self.shadow = shadow
        #: the agent's host runs its tools (a served agent: the caller answers with a tool message)
        self.host = host
        self.sink_policy = sink_policy
        self.recorded = {c.call_id: c for c in recorded_calls}

    def run_read_only(self, env: dict[str, Any], name: str, args: dict[str, Any]) -> Any:
        if name not in self.tools:
            return {"error": f"unknown tool {name}"}
        try:
            return self.tools[name].fn(env, args)
        except ToolError as exc:
            return {"error": str(exc)}

    def apply_committed(self, env: dict[str, Any], calls: Sequence[ToolCallRecord]) -> None:
        """Move ``env`` by the committed consequential calls of a record (restoring a snapshot)."""
        for c in calls:
            if c.consequential and c.committed and c.arguments is not None:
                self.tools[c.name].fn(env, c.arguments)

    def already_fired(self, call_id: str) -> ToolCallRecord | None:
        """The recorded call if this call id already happened: committed in the record, or present in the
        real outbox (the sink is the ground truth for side effects)."""
        rec = self.recorded.get(call_id)
        if rec is not None and rec.committed:
            return rec
        if self.outbox.fired(call_id):
            return rec or ToolCallRecord(
                session_id="",
                call_id=call_id,
                turn=0,
                name="",
                arguments=None,
                raw="",
                consequential=True,
                committed=True,
                status="executed",
                block_id="",
            )
        return None

    def scaffold(
        self, env: dict[str, Any], *, session_id: str, t: int, name: str, args: dict[str, Any], block_id: str
    ) -> ToolCallRecord:
        """The scaffold runs a tool the episode names (a tool step): its result is the observation."""
        spec = self.tools.get(name)
        return ToolCallRecord(
            session_id=session_id,
            call_id=f"{session_id}:t{t}:scaffold",
            turn=t,
            name=name,
            arguments=args,
            raw="",
            # a scaffold action (a booking that returns its id) moves the environment: restore must
            # replay it like any committed consequential call
            consequential=bool(spec and spec.consequential),
            committed=True,
            status="executed",
            result=self.run_read_only(env, name, args),
            block_id=block_id,
        )

    def model_call(
        self,
        env: dict[str, Any],
        *,
        session_id: str,
        t: int,
        k: int,
        name: str,
        args: dict[str, Any] | None,
        raw: str,
        pending: bool,
        block_id: str,
        before_side_effect: Callable[[], None],
    ) -> tuple[CallOutcome, ToolCallRecord]:
        """The k-th tool call the model wrote in transition t: dispatched, and recorded."""
        call_id = f"{session_id}:t{t}:{k}"
        outcome = self.dispatch(
            env,
            call_id=call_id,
            session_id=session_id,
            name=name,
            args=args,
            pending=pending,
            before_side_effect=before_side_effect,
        )
        spec = self.tools.get(name)
        record = ToolCallRecord(
            session_id=session_id,
            call_id=call_id,
            turn=t,
            name=name,
            arguments=args,
            raw=raw,
            consequential=bool(spec and spec.consequential),
            committed=outcome.committed,
            status=outcome.status,
            result=outcome.result,
            block_id=block_id,
        )
        return outcome, record

    def dispatch(
        self,
        env: dict[str, Any],
        *,
        call_id: str,
        session_id: str,
        name: str,
        args: dict[str, Any] | None,
        pending: bool,
        before_side_effect: Callable[[], None],
    ) -> CallOutcome:
        spec = self.tools.get(name)
        if spec is not None and args is not None and self.sink_policy and self.sink_policy.blocks(name, args):
            return CallOutcome("blocked", BLOCKED)
        if spec is None:
            return CallOutcome("unknown_tool")
        if args is None:
            return CallOutcome("malformed")
        if pending:
            return CallOutcome("pending")  # a pending plan: recorded, not executed
        if self.host:
            return CallOutcome("requested")  # the host runs it; its result is the next observation
        if spec.consequential and self.shadow:
            fired = self.already_fired(call_id)
            if fired is not None:
                spec.fn(env, args)  # the environment still moves as it did
                return CallOutcome("shadowed", fired.result, committed=True)  # never again
            return CallOutcome("shadowed", spec.fn(env, args))  # counterfactual: computed, not performed
        if spec.consequential:
            before_side_effect()  # a checkpoint: replay can restore to a state where it has not fired
            self.outbox.fire(call_id, session_id, name, args)
            return CallOutcome("executed", spec.fn(env, args), committed=True)
        return CallOutcome("executed", self.run_read_only(env, name, args))
