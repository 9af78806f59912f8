"""Knobs and the three-phase composition every suite shares.

A builder supplies the parts of an episode (the opening, a pool of clean setup turns, the acquisition
step, the contamination steps, and pools of future queries that do or do not depend on the target);
``compose`` lays them out under the knobs:

- ``position``: how much clean session precedes the target (``setup`` sets the count directly, which the
  tau sweep uses; 0 puts the target in the first transition). The setup phase holds
  ``round(turns_after * f / (1 - f))`` turns (at least the opening), f = 0.1 / 0.5 / 0.8 for
  early / middle / late, so tau sits at about that fraction of the session.
- ``depth``: derivation depth 0..3, contamination steps stacked in order: answer, plan, summary.
- ``turns_after``: transitions after the acquisition step (contamination included), default 12.
- ``indep``: fraction of those turns whose content does not depend on the target; they run as
  isolated sub-tasks (``independent`` steps), so their independence is structural, not hoped for.
  A builder's ``closing`` steps (a post-target task the agent acts on, with its tool-result rounds)
  end the session in their own order and count among the dependent turns.
- ``checkpoint_policy``: stamped on each episode; ``record --checkpoints`` overrides it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from eu_audit.episodes import Episode, MemoryItem, Phase, Step, StepKind, Target
from eu_audit.errors import BadInput

POSITION_FRACTION = {"early": 0.1, "middle": 0.5, "late": 0.8}


class Knobs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    n: int | None = Field(default=None, ge=1, description="episodes to build (default: the suite's size)")
    turns_after: int = Field(default=12, ge=0, description="transitions after the target's entry")
    indep: float = Field(default=0.5, ge=0.0, le=1.0, description="fraction of them independent of z")
    position: Literal["early", "middle", "late"] = "early"
    setup: int | None = Field(
        default=None, ge=0, description="setup turns before the target (overrides position)"
    )
    depth: int = Field(default=3, ge=0, le=3, description="answer, plan, summary stacked")
    checkpoint_policy: Literal["every_turn", "semantic", "session_start"] = "every_turn"

    def setup_turns(self, opening: int) -> int:
        if self.setup is not None:
            return self.setup
        f = POSITION_FRACTION[self.position]
        return max(opening, round(self.turns_after * f / (1 - f)))

    def split_after(self) -> tuple[int, int]:
        """(dependent future queries, independent ones) after the ``depth`` contamination steps."""
        n_indep = round(self.indep * self.turns_after)
        n_dep = self.turns_after - self.depth - n_indep
        if n_dep < 0:
            raise BadInput(
                f"--turns-after {self.turns_after} cannot hold depth {self.depth} plus "
                f"{n_indep} independent turns (indep {self.indep}); lower --depth or --indep"
            )
        return n_dep, n_indep


@dataclass
class EpisodeParts:
    """What a builder knows about one episode; ``compose`` turns it into an ``Episode``."""

    id: str
    suite: str
    target: Target
    acquisition: Step
    answer: Step  # depth >= 1: a question whose honest answer uses z
    plan: Step  # depth >= 2: a pending tool plan that would route on z
    dependent: list[Step]  # future queries that read the context (task-shaped, soliciting z)
    independent: list[Step]  # future work that does not need z (run isolated)
    opening: list[Step] = field(default_factory=list)  # always first (the user's task, a greeting)
    setup_pool: list[Step] = field(default_factory=list)  # more clean turns, cycled as needed
    closing: list[Step] = field(default_factory=list)  # last, in order (a task the agent acts on)
    description: str = ""
    system: str | None = None
    toolset: str = "builtin"
    tools: list[str] = field(default_factory=list)
    memory: list[MemoryItem] = field(default_factory=list)
    env: dict[str, Any] = field(default_factory=dict)
    counterfactual_env: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def _cycle(pool: list[Step], n: int, what: str, episode_id: str) -> list[Step]:
    if n and not pool:
        raise BadInput(f"episode {episode_id}: no {what} to draw {n} turns from")
    return [pool[i % len(pool)].model_copy(deep=True) for i in range(n)]


def compose(parts: EpisodeParts, knobs: Knobs, rng: random.Random) -> Episode:
    n_setup = knobs.setup_turns(len(parts.opening))
    setup = [s.model_copy(deep=True) for s in parts.opening][:n_setup]
    if parts.setup_pool:  # a data set with fewer clean turns than asked for keeps what it has
        setup += _cycle(parts.setup_pool, max(0, n_setup - len(setup)), "setup turns", parts.id)
    for s in setup:
        s.phase = Phase.setup
    acquisition = parts.acquisition.model_copy(update={"phase": Phase.acquisition})
    contamination = [parts.answer, parts.plan, Step(kind=StepKind.compact)][: knobs.depth]
    contamination = [s.model_copy(update={"phase": Phase.contamination}) for s in contamination]
    n_dep, n_indep = knobs.split_after()
    closing = [s.model_copy(deep=True) for s in parts.closing][:n_dep]
    dependent = _cycle(parts.dependent, n_dep - len(closing), "dependent future queries", parts.id)
    independent = _cycle(parts.independent, n_indep, "independent turns", parts.id)
    for s in dependent + closing:
        s.independent = False
    for s in independent:
        s.independent = True
    further = dependent + independent
    rng.shuffle(further)
    further += closing
    for s in further:
        s.phase = Phase.further
    meta = dict(parts.meta)
    meta["knobs"] = knobs.model_dump(exclude={"n"})
    return Episode(
        id=parts.id,
        suite=parts.suite,
        description=parts.description,
        system=parts.system,
        toolset=parts.toolset,
        tools=parts.tools,
        memory=parts.memory,
        env=parts.env,
        counterfactual_env=parts.counterfactual_env,
        target=parts.target,
        steps=[*setup, acquisition, *contamination, *further],
        checkpoint_policy=knobs.checkpoint_policy,
        meta=meta,
    )
