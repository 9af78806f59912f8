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
from typing import Any

from pydantic import ValidationError

from eu_audit.episodes import Episode, StepKind
from eu_audit.jsonl import describe_validation_error
from eu_audit.matching import contains_target
from eu_audit.runtime.tools import ENVIRONMENTS, TOOLSETS, ToolError, load_toolset
from eu_audit.runtime.world import World


class EpisodeProblem(ValueError):
    """An episode that would fail mid-run, found at load time: ``field`` says where."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def check_episode(ep: Episode) -> None:
    """What an episode needs from the rest of eu-audit, checked before any model runs: its toolset is
    registered, every tool it names is in that toolset, and its environments fit the toolset's schema."""
    if ep.toolset not in TOOLSETS:
        raise EpisodeProblem(
            "toolset", f"unknown toolset '{ep.toolset}' (known: {', '.join(TOOLSETS.names())})"
        )
    tools = load_toolset(ep.toolset)
    for i, name in enumerate(ep.tools):
        if name not in tools:
            raise EpisodeProblem(f"tools.{i}", f"tool '{name}' is not in toolset '{ep.toolset}'")
    for i, step in enumerate(ep.steps):
        if step.kind is StepKind.tool and step.tool not in tools:
            raise EpisodeProblem(f"steps.{i}.tool", f"tool '{step.tool}' is not in toolset '{ep.toolset}'")
    if ep.toolset in ENVIRONMENTS:
        schema = ENVIRONMENTS.get(ep.toolset)
        for name, env in (("env", ep.env), ("counterfactual_env", ep.counterfactual_env)):
            if env is None:
                continue
            try:
                schema.model_validate(env)
            except ValidationError as exc:
                where, msg = describe_validation_error(exc)
                raise EpisodeProblem(f"{name}.{where}", f"not a '{ep.toolset}' environment: {msg}") from None


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
