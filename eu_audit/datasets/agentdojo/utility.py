"""AgentDojo's own utility check of an episode's user task, registered for the audit's utility."""

from __future__ import annotations

from typing import Any

from eu_audit.audits.metrics import UTILITY_CHECKS
from eu_audit.datasets.agentdojo import env as ad
from eu_audit.episodes import Episode


@UTILITY_CHECKS.register("agentdojo")
def task_utility(episode: Episode, model_output: str, calls: list[tuple[str, dict[str, Any]]]) -> bool | None:
    """AgentDojo's own utility check of the episode's user task: the model's text and the environment
    after the state-changing calls the agent executed. None for episodes not from AgentDojo."""
    meta = episode.meta
    if meta.get("source", "").split(" ")[0] != "agentdojo" or "user_task" not in meta:
        return None
    suite = ad.suite(meta["suite"], meta["source"].split(" ")[-1])
    spec = episode.env["agentdojo"]
    pre = ad.environment(spec)
    post = ad.environment(spec, [[n, a] for n, a in calls if ad.is_consequential(n)])
    with ad.frozen_time():
        return bool(suite.user_tasks[meta["user_task"]].utility(model_output, pre, post))
