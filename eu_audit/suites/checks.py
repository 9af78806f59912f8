"""Model-free checks of an episode: its scripted observation stream in either world.

The scripted observations are what the scaffold puts in front of the agent whatever the model says:
user and memory messages, and the results of scaffold tool steps run on the episode's environment.
(Tool results of the model's own calls and the model's turns depend on the model and are not here.)
``target_positions`` is the suite contract: in the factual world the target is in exactly the
acquisition observation; in the counterfactual world it is nowhere.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Literal

from eu_audit.episodes import Episode, StepKind
from eu_audit.matching import contains_target
from eu_audit.runtime.tools import ToolError, load_toolset

World = Literal["factual", "counterfactual"]


def scripted_observations(ep: Episode, world: World = "factual") -> list[str | None]:
    """One entry per step: the observation text, or None where the model's own output decides it."""
    toolset = load_toolset(ep.toolset)
    env: dict[str, Any] = copy.deepcopy(
        ep.env
        if world == "factual"
        else (ep.counterfactual_env if ep.counterfactual_env is not None else ep.env)
    )
    out: list[str | None] = []
    for step in ep.steps:
        if step.kind in (StepKind.user, StepKind.memory):
            cf = world == "counterfactual" and step.counterfactual is not None
            out.append(step.counterfactual if cf else step.content)
        elif step.kind is StepKind.tool:
            assert step.tool is not None
            try:
                result: Any = toolset[step.tool].fn(env, dict(step.args))
            except ToolError as exc:
                result = {"error": str(exc)}
            out.append(json.dumps(result, sort_keys=True))
        else:
            out.append(None)
    return out


def target_positions(ep: Episode, world: World = "factual") -> list[int]:
    """1-based transitions whose scripted observation contains the target (any variant)."""
    return [
        t
        for t, text in enumerate(scripted_observations(ep, world), 1)
        if text is not None and contains_target(text, ep.target.value, ep.target.variants)
    ]
