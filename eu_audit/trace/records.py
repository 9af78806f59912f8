"""The records of a recording: one pydantic model per kind of fact about a session.

These are the domain's single definition (the runtime writes them, methods and audits read them). The
trace bundle (``eu_audit.bundle``) stores one record per JSONL line with its ``type`` tag, so the field
order here is also the file format; the bundle adds only the ``end`` record and the line union.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from eu_audit.checkpoints import Checkpoint, CheckpointPolicy
from eu_audit.defaults import TURN_MAX_TOKENS, TURN_TEMPERATURE
from eu_audit.episodes import MAX_NEW_TOKENS, Episode, Phase, StepKind, Target
from eu_audit.errors import BadInput
from eu_audit.matching import TargetMatcher
from eu_audit.tiers import tier_ids
from eu_audit.trace.blocks import RuntimeBlock

SCHEMA_VERSION = "eu-audit/trace@2"
#: the versions this eu-audit reads: trace@1 kept a copy of the session's target beside its episode's (the
#: copy must equal it, and is dropped on reading: the target is stored once, in the episode)
READS = ("eu-audit/trace@1", SCHEMA_VERSION)


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelInfo(_Record):
    name: str
    weight_digest: str
    chat_template_digest: str
    chat_format: str
    dtype: str


class Decoding(_Record):
    temperature: float = Field(TURN_TEMPERATURE, ge=0.0, le=10.0, allow_inf_nan=False)
    # 0: not eu-audit's choice (a black-box agent)
    max_tokens: int = Field(TURN_MAX_TOKENS, ge=0, le=MAX_NEW_TOKENS)


def check_decoding(temperature: float, max_tokens: int) -> Decoding:
    """The decoding a run will record, refused up front if the bundle could not hold it (a NaN
    temperature, a turn length no episode allows)."""
    if max_tokens < 1:
        raise BadInput(f"--max-tokens must be at least 1, not {max_tokens}")
    try:
        return Decoding(temperature=temperature, max_tokens=max_tokens)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise BadInput(f"--{str(err['loc'][0]).replace('_', '-')}: {err['msg']}") from None


#: the engine a black-box bundle names (``eu-audit gate``): a deployed agent seen from outside,
#: no cache of ours to rebuild
BLACK_BOX_ENGINE = "agent"
#: the method a deployed agent's forgetting tenant is recorded under (beside ``b5``, its reference, and
#: ``b0``, its positive control): the states a gate reads as ``agent.leak_probes``. The same word as the
#: engine above, a different thing: one names the run's side, this one tenant's rows.
AGENT_METHOD = "agent"
#: which side made a run: states rebuilt from their cache (white), or a deployed agent from outside (black)
Side = Literal["white", "black"]


def side_of(engine: str) -> Side:
    """The side a run recorded on ``engine`` is, the one place ``BLACK_BOX_ENGINE`` is compared."""
    return "black" if engine == BLACK_BOX_ENGINE else "white"


class Header(_Record):
    type: Literal["header"] = "header"
    schema_version: str = SCHEMA_VERSION
    tool_version: str
    model: ModelInfo
    engine: str

    @field_validator("schema_version")
    @classmethod
    def _read_as_current(cls, version: str) -> str:
        """A version this eu-audit reads is held, and written again, as the current one: its records are
        read into today's shapes (``SessionRecord`` drops trace@1's copy of the target)."""
        return SCHEMA_VERSION if version in READS else version

    @property
    def side(self) -> Side:
        """Which side made the run (``eu-audit gate``: black)."""
        return side_of(self.engine)

    #: what the engine's states depend on (library versions, threads, batch sizes, cache type)
    engine_facts: dict[str, Any] = Field(default_factory=dict)
    decoding: Decoding
    seed: int
    suite: str
    checkpoint_policy: CheckpointPolicy
    parent_digest: str | None = None  # sha256 of the bundle this one was derived from
    kv_sidecar: str | None = None  # file name of a safetensors sidecar, if one was asked for


class MemoryEntry(_Record):
    id: str
    text: str
    source_ids: list[str] = Field(default_factory=list)
    derived: bool = False  # a model-written write-back (vs a record the user or platform stored)


class SinkPolicy(_Record):
    """FIDES-style sink gating: identifier-type tool arguments carrying a tainted value are blocked."""

    blocked_values: list[str]
    identifier_args: dict[str, list[str]]  # tool name -> argument names that route or select

    def blocks(self, tool: str, arguments: dict[str, Any]) -> bool:
        """Would this call be blocked? An identifier argument holds a tainted value (the target
        matcher's reach: any variant or paraphrase, up to case, spacing and punctuation)."""
        if not self.blocked_values:
            return False
        matcher = TargetMatcher.of(self.blocked_values[0], self.blocked_values[1:])
        return any(
            matcher.found_in(str(arguments.get(arg, ""))) for arg in self.identifier_args.get(tool, [])
        )


class SkippedStep(_Record):
    """A step of the episode a black-box run could not drive, and why (e.g. the agent lacks an operation)."""

    t: int
    kind: str
    reason: str


#: a session's id as eu-audit writes it: ``s{index}``, its run-wide number (a tenant's ``/method`` after it)
_NUMBERED = re.compile(r"^s(\d+)(?:/|$)")


def session_id_of(index: int) -> str:
    """The id of the session numbered ``index`` in its run."""
    return f"s{index}"


def session_number(session_id: str) -> int | None:
    """The run-wide number an id eu-audit wrote carries (``s4``, ``s4/agent``: 4); None for another id."""
    m = _NUMBERED.match(session_id)
    return int(m.group(1)) if m else None


class SessionRecord(_Record):
    type: Literal["session"] = "session"
    session_id: str
    episode_id: str
    suite: str
    transitions: int  # T
    seed: int
    source_id: str
    #: the session's run-wide number (``session_id_of``): the same whichever shard ran it, so a shard keeps
    #: its sessions by it and a merge orders by it; None where the run numbered none (a hand-made id)
    index: int | None = None
    final_manifest: list[str] = Field(default_factory=list)  # blocks resident in the cache at R_T
    memory_final: list[MemoryEntry] = Field(default_factory=list)  # the persistent store at R_T
    method: str | None = None  # the forget method that produced this state (None: as recorded)
    parent_session: str | None = None  # the recorded session a post-forget state derives from
    #: black-box runs: the opaque name this session's tenant had in serve's log, the only name its calls
    #: carry there (no role or session id does), so the log is read for this session by it
    tenant: str | None = None
    kv_excised: list[tuple[int, int]] = Field(default_factory=list)  # positions cut from the final cache
    sink_policy: SinkPolicy | None = None  # information-flow sink policy in force (B8, B9)
    skipped: list[SkippedStep] = Field(default_factory=list)  # black-box runs: steps not driven, and why
    episode: Episode  # the script, counterfactual stream included: bundles are self-contained for replay

    @model_validator(mode="before")
    @classmethod
    def _older_lines(cls, data: Any) -> Any:
        """A trace@1 line (it always held a copy of the target): the copy refused unless it is the
        episode's, then dropped; the run-wide number it had no field for read from its id. A line made
        today carries its number as written (``record`` and ``eu-audit gate`` set it), never parsed."""
        if isinstance(data, dict) and "target" in data:
            data = dict(data)
            if "index" not in data and isinstance(data.get("session_id"), str):
                data["index"] = session_number(data["session_id"])
            copy, episode = data.pop("target"), data.get("episode")
            mine = episode.get("target") if isinstance(episode, dict) else getattr(episode, "target", None)
            if Target.model_validate(copy) != Target.model_validate(mine):
                raise ValueError("its target differs from its episode's target (trace@1 kept both)")
        return data

    @property
    def target(self) -> Target:
        """z: the episode's target (stored once, in the episode)."""
        return self.episode.target


class ObservationRecord(_Record):
    type: Literal["observation"] = "observation"
    session_id: str
    t: int
    kind: StepKind
    phase: Phase
    content: str
    source_ids: list[str] = Field(default_factory=list)
    independent: bool = False
    block_id: str


class BlockRecord(_Record):
    type: Literal["block"] = "block"
    session_id: str
    block: RuntimeBlock


class ToolCallRecord(_Record):
    type: Literal["tool_call"] = "tool_call"
    session_id: str
    call_id: str
    turn: int
    name: str
    arguments: dict[str, Any] | None
    raw: str
    consequential: bool
    committed: bool
    status: Literal[
        "executed", "pending", "shadowed", "blocked", "malformed", "unknown_tool", "error", "requested"
    ]
    result: Any = None
    block_id: str


class CheckpointRecord(_Record):
    type: Literal["checkpoint"] = "checkpoint"
    session_id: str
    checkpoint: Checkpoint


class ForgetRequestRecord(_Record):
    type: Literal["forget_request"] = "forget_request"
    session_id: str
    target: str  # z
    source: str | None = None  # s: the flagged source artifact, if the requester knows it
    variants: list[str] = Field(default_factory=list)
    reason: str = ""


class LedgerRecord(_Record):
    type: Literal["ledger"] = "ledger"
    session_id: str
    method: str
    transitions_replayed: int
    tokens_reused: int | None  # None: the engine (a served one) could not tell, never 0 by default
    tokens_prefilled: int
    tokens_decoded: int
    wall_s: float | None = None
    checkpoint_id: str | None = None
    tau: int | None = None
    closure_size: int | None = None


class Occurrence(_Record):
    where: Literal["context", "memory", "pending_tool_call", "committed_tool_call"]
    id: str
    kind: str  # block type, "memory", or the tool name
    turn: int | None = None


class ReceiptRecord(_Record):
    """A forget receipt: where the target's variants are left in the post-forget state."""

    type: Literal["receipt"] = "receipt"
    session_id: str
    method: str
    target: str
    clean: bool  # no occurrence in context, memory or pending tool calls
    occurrences: list[Occurrence] = Field(default_factory=list)
    blocked_sinks: int = 0  # pending calls a sink policy would block
    shadowed_calls: int = 0  # consequential calls replay shadow-executed instead of firing


class ElicitationRecord(_Record):
    """A black-box run's probe, sample or choice, asked of the agent after its forget (or of the B5
    reference tenant): the audits read these instead of running the model again."""

    type: Literal["elicitation"] = "elicitation"
    session_id: str
    kind: Literal["probe", "sample", "choice"]
    name: str  # the probe's id, or "task" for samples and the choice step for choices
    where: Literal["fork", "fresh session"]  # a fork of the session, or a new session of the same tenant
    prompt: str
    answer: str
    seed: int | None = None  # the seed serve pinned for a sample (None: greedy)


class ResidueRecord(_Record):
    """What a black-box agent still holds of the target where it can be seen from outside: in the prompts
    its model received after the forget (the serve log), and in its store dump."""

    type: Literal["residue"] = "residue"
    session_id: str
    context_calls: int | None = None  # model calls after the forget (None: no serve log)
    context_calls_with_z: int | None = None
    #: where in the prompt z was: tier id (``eu_audit.tiers``) -> calls; a bundle written before the ids
    #: keyed them by their labels, read as ids
    context_tiers: dict[str, int] = Field(default_factory=dict)
    context_example: str = ""  # one prompt snippet that still carried z
    _tier_ids = field_validator("context_tiers", mode="before")(tier_ids)
    store_items: int | None = None  # items in the store dump (None: the agent offers no dump)
    store_items_with_z: int | None = None
    store_tiers: dict[str, int] = Field(default_factory=dict)  # store name -> items holding z
    store_example: str = ""
    #: every store the dump held, name -> items (so a gate naming a store the agent lacks fails closed);
    #: {} for an empty dump, None where unknown (no dump, or a bundle recorded before the field)
    stores: dict[str, int] | None = None
    serve_log_digest: str = ""  # sha256 of the serve log when these were read
    #: "" the first check (the prompts of the turns and probes after the forget, then the dump); else the
    #: recheck event this record was taken after (``at-once``: the dump right after the forget, before
    #: those turns; ``restart``, ``compact``, ``turns-N``: ``eu_audit.blackbox.recheck``), in the order
    #: the events ran
    after: str = ""
    skipped: str = ""  # why that event could not run (the agent lacks it): its figures are unknown
    replies: int | None = None  # the agent's answers during the event's turns, and those holding z
    replies_with_z: int | None = None
    reply_example: str = ""
    #: tamper attempts serve's log shows for this tenant (the first check only; ``eu_audit.blackbox.tamper``):
    #: kind -> count, and one example of each
    tamper: dict[str, int] = Field(default_factory=dict)
    tamper_examples: dict[str, str] = Field(default_factory=dict)
    #: what eu-audit read itself in the files the agent keeps the tenant in (``eu_audit.blackbox.forensics``;
    #: the first check only): channel (rows, orphans, bytes, vectors) -> count; None where no file was named
    disk: dict[str, int] | None = None
    disk_examples: dict[str, str] = Field(default_factory=dict)
    disk_unread: dict[str, str] = Field(default_factory=dict)  # file -> why it was not measured
    disk_files: int | None = None  # files read
    #: files read that the agent wrote and did not name (``eu_audit.blackbox.undeclared``)
    disk_undeclared: list[str] = Field(default_factory=list)
    #: the bystander tenant's memories (``eu_audit.blackbox.bystander``) and how many of them the agent's
    #: forget lost (None: not measured: the agent lacks memory_inject or store_dump)
    bystander_records: int | None = None
    bystander_lost: int | None = None
    bystander_example: str = ""


class AgentForgetRecord(_Record):
    """The agent's own forget, as it answered it (kept verbatim)."""

    type: Literal["agent_forget"] = "agent_forget"
    session_id: str
    status: Literal["ok", "partial", "unsupported", "error"]
    detail: str = ""
    receipt: dict[str, Any] = Field(default_factory=dict)
    wall_s: float | None = None
    #: whether the dump right after the forget differs from the one right before (False: a no-op; None:
    #: the agent offers no dump, or a bundle from before the field)
    changed: bool | None = None
