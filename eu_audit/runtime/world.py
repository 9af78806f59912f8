"""Which world a run lives in: the recording (factual) or the one that never saw z (counterfactual).

Everything that asks "what does this step show?" asks it here: the observation text (o_t, or o_tau
without z), the source ids it carries (none in the counterfactual world), the environment the tools run
on, and the persistent memory record a memory step surfaces.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from eu_audit.episodes import Episode, Step

World = Literal["factual", "counterfactual"]


@dataclass(frozen=True)
class WorldView:
    episode: Episode
    world: World = "factual"

    @property
    def factual(self) -> bool:
        return self.world == "factual"

    def text(self, step: Step) -> str:
        """The step's observation text in this world."""
        if self.factual or step.counterfactual is None:
            return step.content
        return step.counterfactual

    def sources(self, step: Step) -> list[str]:
        """Source ids the step's observation carries: the target's, in the factual world only."""
        return [step.source] if step.source and self.factual else []

    def environment(self) -> dict[str, Any]:
        """A fresh copy of the environment the tools start from in this world."""
        ep = self.episode
        env = ep.env if self.factual or ep.counterfactual_env is None else ep.counterfactual_env
        return copy.deepcopy(env)

    def memory_record(self, step: Step, t: int) -> tuple[str, str, list[str]]:
        """(record id, text, source ids) of the persistent record a memory step at transition t stores."""
        return step.memory_id or f"m-t{t}", self.text(step), self.sources(step)


def memory_shown(record_id: str, text: str) -> str:
    """How a memory step's record appears in the context (the observation's text)."""
    return f"Memory record {record_id} (retrieved from long-term memory): {text}"


def env_snapshot_id(env: dict[str, Any]) -> str:
    """A short content hash of an environment: what a checkpoint records to check a restore against."""
    return hashlib.sha256(json.dumps(env, sort_keys=True, default=str).encode()).hexdigest()[:16]
