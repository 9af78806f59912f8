"""AgentDojo's tools, run offline on its suite environments (``agentdojo`` on PyPI, v1.2.2 data).

An episode's ``env`` is JSON: ``{"agentdojo": {"suite", "version", "injections"}, "log": [...]}``.
The live environment is AgentDojo's pydantic object, rebuilt from that spec on every call and moved
forward by replaying the logged state-changing calls. That keeps our environment a plain value (its
snapshot id is a hash, restore is replay) while AgentDojo's own functions do the work. Time is frozen
while they run: several tools stamp ``datetime.now()``, and replays must be identical.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Mapping
from functools import cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import to_jsonable_python

from eu_audit.errors import BadInput
from eu_audit.runtime.tools import ENVIRONMENTS, TOOLSETS, ToolError, ToolFn, ToolSpec

VERSION = "v1.2.2"
SUITE_NAMES = ("workspace", "slack", "banking", "travel")
#: AgentDojo's environments describe 2024-05-15 as "today"; every tool call runs at this instant.
FROZEN_NOW = dt.datetime(2024, 5, 15, 12, 0, tzinfo=dt.UTC)
_READ_PREFIXES = ("get_", "read_", "search_", "list_", "check_")
#: Read-named tools that still change the environment (a visit is logged, which AgentDojo scores).
_STATEFUL_READS = frozenset({"get_webpage"})
_IDENTIFIER_ARGS = frozenset(
    {
        "recipient",
        "recipients",
        "iban",
        "email",
        "url",
        "user",
        "channel",
        "file_id",
        "participants",
        "cc",
        "bcc",
        "hotel",
        "restaurant",
        "company",
        "address",
        "id",
        "event_id",
        "user_email",
    }
)


def _require() -> Any:
    try:
        from agentdojo.task_suite.load_suites import get_suites
    except ImportError as exc:  # pragma: no cover - a dependency of eu-audit
        raise BadInput("the AgentDojo suite needs the 'agentdojo' package (pip install agentdojo)") from exc
    return get_suites


@cache
def suite(name: str, version: str = VERSION) -> Any:
    return _require()(version)[name]


def frozen_time() -> Any:
    import time_machine

    return time_machine.travel(FROZEN_NOW, tick=False)


def function_is_consequential(tool_name: str) -> bool:
    return tool_name in _STATEFUL_READS or not tool_name.startswith(_READ_PREFIXES)


@cache
def _pristine(name: str, version: str, injections_json: str) -> Any:
    with frozen_time():
        return suite(name, version).load_and_inject_default_environment(json.loads(injections_json))


def environment(spec: Mapping[str, Any], log: list[Any] | tuple[Any, ...] = ()) -> Any:
    """AgentDojo's environment for ``spec``, with the logged state-changing calls applied."""
    from agentdojo.functions_runtime import FunctionsRuntime

    s = suite(spec["suite"], spec.get("version", VERSION))
    env = _pristine(
        spec["suite"], spec.get("version", VERSION), json.dumps(spec.get("injections", {}), sort_keys=True)
    )
    env = env.model_copy(deep=True)
    runtime = FunctionsRuntime(s.tools)
    with frozen_time():
        for name, args in log:
            runtime.run_function(env, name, args)
    return env


def run_function(env: dict[str, Any], name: str, args: dict[str, Any]) -> Any:
    """Run one AgentDojo function on the episode environment ``env`` (moved forward in place)."""
    from agentdojo.functions_runtime import FunctionsRuntime

    spec = env["agentdojo"]
    log = env.setdefault("log", [])
    live = environment(spec, log)
    runtime = FunctionsRuntime(suite(spec["suite"], spec.get("version", VERSION)).tools)
    with frozen_time():
        result, error = runtime.run_function(live, name, args)
    if error:
        raise ToolError(error)
    if function_is_consequential(name):
        log.append([name, dict(args)])
    return to_jsonable_python(result, fallback=str)


def _params(schema: dict[str, Any]) -> dict[str, str]:
    out = {}
    for pname, prop in schema.get("properties", {}).items():
        kind = prop.get("type") or "|".join(p.get("type", "any") for p in prop.get("anyOf", []))
        out[pname] = str(kind or "any")
    return out


def _toolset(suite_name: str) -> dict[str, ToolSpec]:
    s = suite(suite_name)
    specs = {}
    for f in s.tools:
        params = _params(f.parameters.model_json_schema())
        first_line = f.description.strip().splitlines()[0] if f.description.strip() else f.name
        specs[f.name] = ToolSpec(
            name=f.name,
            description=first_line,
            params=params,
            consequential=function_is_consequential(f.name),
            identifier_args=tuple(p for p in params if p in _IDENTIFIER_ARGS),
            fn=_bound(f.name),
        )
    return specs


def _bound(name: str) -> ToolFn:
    return lambda env, args: run_function(env, name, args)


class AgentDojoSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    suite: Literal["workspace", "slack", "banking", "travel"]
    version: Literal["v1.2.2"] = "v1.2.2"
    injections: dict[str, str] = Field(default_factory=dict)  # injection vector -> its text


class AgentDojoEnv(BaseModel):
    """An episode's AgentDojo world: which suite environment, its injections, the logged effects."""

    model_config = ConfigDict(extra="forbid")

    agentdojo: AgentDojoSpec
    log: list[tuple[str, dict[str, Any]]] = Field(default_factory=list)


for _name in SUITE_NAMES:
    TOOLSETS.add(f"agentdojo-{_name}", functools.partial(_toolset, _name))
    ENVIRONMENTS.add(f"agentdojo-{_name}", AgentDojoEnv)
