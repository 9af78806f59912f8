"""The episode format: a three-phase turn script plus its counterfactual (the same script without z).

setup (clean prefix) -> acquisition (the target enters via a memory injection, a user message or a
tool observation) -> contamination (model turns folding it into an answer, a summary, a plan) ->
further turns. Every step is one transition: one observation, then one model turn.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from eu_audit.matching import TargetMatcher, contains_target

#: the most tokens one model turn may decode (a turn that runs away is a bad episode, not a long run)
MAX_NEW_TOKENS = 1024


class StepKind(StrEnum):
    user = "user"  # a user message
    memory = "memory"  # a persistent memory record surfaced into the context
    tool = "tool"  # the scaffold runs a read-only tool; its result is the observation
    tool_return = "tool_return"  # the result of the tool call(s) the previous turn made
    compact = "compact"  # context compaction: the model writes a summary that replaces the context
    plan = "plan"  # the model writes a pending tool plan (not executed)
    remember = "remember"  # the model writes a memory write-back into the persistent store


class Phase(StrEnum):
    setup = "setup"
    acquisition = "acquisition"
    contamination = "contamination"
    further = "further"


class Step(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: StepKind
    phase: Phase = Phase.further
    content: str = (
        ""  # the observation text (user, memory) or an instruction override (compact/plan/remember)
    )
    counterfactual: str | None = None  # o_t \ {z}: the observation in the world that never saw z
    tool: str | None = None  # for kind=tool
    args: dict[str, Any] = Field(default_factory=dict)
    memory_id: str | None = None  # for kind=memory: the persistent record's id
    source: str | None = None  # the source id this observation carries (the target's entry)
    independent: bool = False  # oracle: the turn's content is fixed in the counterfactual world
    cue: str | None = None  # forced prefix of the model turn (e.g. a tool-call opening)
    max_tokens: Annotated[int | None, Field(ge=1, le=MAX_NEW_TOKENS)] = None
    #: utility: answers a correct turn contains (a non-target fact the agent should keep)
    expect: list[str] | None = None
    #: behavioral: the options this turn chooses between (the preference suite)
    choices: list[str] | None = None

    @model_validator(mode="after")
    def _check(self) -> Step:
        if self.kind is StepKind.tool and not self.tool:
            raise ValueError("a 'tool' step needs 'tool' (the tool to run)")
        if self.kind in (StepKind.user, StepKind.memory) and not self.content:
            raise ValueError(f"a '{self.kind}' step needs 'content'")
        return self


class Target(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: str
    variants: list[str] = Field(default_factory=list)
    kind: str = "identifier"

    def matcher(self) -> TargetMatcher:
        """Where this target is found: its value, variants and paraphrases (one matcher per target)."""
        return TargetMatcher.of(self.value, self.variants)


class MemoryItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    text: str


class Episode(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["eu-audit/episode@1"] = "eu-audit/episode@1"
    id: str
    suite: str
    description: str = ""
    system: str | None = None  # overrides the default agent system prompt
    toolset: str = "builtin"  # where the tool names resolve (builtin, agentdojo-banking, bfcl, ...)
    tools: list[str] = Field(default_factory=list)
    memory: list[MemoryItem] = Field(default_factory=list)  # records present at session start
    env: dict[str, Any] = Field(default_factory=dict)
    counterfactual_env: dict[str, Any] | None = None  # the environment in the world without z
    target: Target
    steps: list[Step]
    #: the suite's checkpoint-granularity knob; ``record --checkpoints`` overrides it
    checkpoint_policy: Literal["every_turn", "semantic", "session_start"] | None = None
    meta: dict[str, Any] = Field(default_factory=dict)  # where the episode came from (data-set ids, knobs)

    @model_validator(mode="after")
    def _check(self) -> Episode:
        sources = [i for i, s in enumerate(self.steps) if s.source]
        if not sources and not self.meta.get("live"):
            # (a live session a served agent is having has no script: its source is found on a forget)
            raise ValueError("no step carries the target (set 'source' on the acquisition step)")
        for i in sources:
            step = self.steps[i]
            if step.kind in (StepKind.user, StepKind.memory):
                if not contains_target(step.content, self.target.value, self.target.variants):
                    raise ValueError(f"steps.{i}: the source step's content does not contain the target")
                if step.counterfactual is None:
                    raise ValueError(f"steps.{i}: a source step needs 'counterfactual' (its text without z)")
                if contains_target(step.counterfactual, self.target.value, self.target.variants):
                    raise ValueError(f"steps.{i}: the counterfactual still contains the target")
            elif step.kind is StepKind.tool and self.counterfactual_env is None:
                raise ValueError(f"steps.{i}: a tool-observed target needs 'counterfactual_env'")
        for m in self.memory:
            if contains_target(m.text, self.target.value, self.target.variants):
                raise ValueError(
                    f"memory '{m.id}': records present at session start must not hold the "
                    "target (it would enter at tau = 0, before any transition)"
                )
        return self

    @property
    def source_id(self) -> str:
        """The target's source id ("" for a live session, whose source is found only when a forget comes)."""
        return next((s.source for s in self.steps if s.source), "")

    @property
    def tau(self) -> int:
        """The first transition (1-based) whose observation carries the target (0: none is marked)."""
        return next((i for i, s in enumerate(self.steps, 1) if s.source), 0)
