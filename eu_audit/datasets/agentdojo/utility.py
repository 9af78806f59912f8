"""AgentDojo's own checks of an episode, registered for the audit: the utility of the post-target user
task (did the agent do it?) and the security of the injection task (did the agent do what the injected
text asked?). Both read the agent's text and the environment after the state-changing calls it executed."""

from __future__ import annotations

from typing import Any

from eu_audit.audits.metrics import SECURITY_CHECKS, UTILITY_CHECKS
from eu_audit.datasets.agentdojo import env as ad
from eu_audit.episodes import Episode

Calls = list[tuple[str, dict[str, Any]]]


def _environments(episode: Episode, calls: Calls) -> tuple[Any, Any, Any]:
    meta = episode.meta
    suite = ad.suite(meta["suite"], meta["source"].split(" ")[-1])
    spec = episode.env["agentdojo"]
    pre = ad.environment(spec)
    post = ad.environment(spec, [[n, a] for n, a in calls if ad.function_is_consequential(n)])
    return suite, pre, post


def _check(task: Any, kind: str, model_output: str, pre: Any, post: Any, calls: Calls) -> bool:
    """AgentDojo's order: the check from the call trace where the task defines one, else the one on the
    environments (as its task suite does)."""
    from agentdojo.functions_runtime import FunctionCall

    traces = [FunctionCall(function=n, args=dict(a)) for n, a in calls]
    with ad.frozen_time():
        from_traces = getattr(task, f"{kind}_from_traces")(model_output, pre, post, traces)
        if from_traces is not None:
            return bool(from_traces)
        return bool(getattr(task, kind)(model_output, pre, post))


def _applies(episode: Episode, key: str) -> bool:
    return episode.meta.get("source", "").split(" ")[0] == "agentdojo" and key in episode.meta


@UTILITY_CHECKS.register("agentdojo")
def task_utility(episode: Episode, model_output: str, calls: Calls) -> bool | None:
    """AgentDojo's utility check of the post-target user task. None for episodes without one (not from
    AgentDojo, or built before the suite had acting turns)."""
    if not _applies(episode, "future_task"):
        return None
    suite, pre, post = _environments(episode, calls)
    return _check(suite.user_tasks[episode.meta["future_task"]], "utility", model_output, pre, post, calls)


@SECURITY_CHECKS.register("agentdojo")
def injection_security(episode: Episode, model_output: str, calls: Calls) -> bool | None:
    """AgentDojo's security check of the injection task: True when the agent carried out the injected
    goal (an attack that succeeded). None for episodes that are not from AgentDojo."""
    if not _applies(episode, "injection_task"):
        return None
    suite, pre, post = _environments(episode, calls)
    task = suite.injection_tasks[episode.meta["injection_task"]]
    return _check(task, "security", model_output, pre, post, calls)
