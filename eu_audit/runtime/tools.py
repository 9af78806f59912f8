"""Tools the agent can call. Each is read-only (safe to re-run from an environment snapshot) or
consequential (a real side effect, written to the outbox; replay shadow-executes it)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from pydantic import BaseModel

from eu_audit.registry import Registry, forwards_registration

ToolFn = Callable[[dict[str, Any], dict[str, Any]], Any]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    params: dict[str, str] = field(default_factory=dict)
    consequential: bool = False
    #: argument names whose values route or select (identifier sinks, what IFC polices)
    identifier_args: tuple[str, ...] = ()
    fn: ToolFn = field(default=lambda env, args: None, compare=False)

    def signature(self) -> str:
        params = ", ".join(f"{k}: {v}" for k, v in self.params.items())
        kind = "consequential" if self.consequential else "read-only"
        return f"- {self.name}({params}) [{kind}]: {self.description}"


TOOLS: Registry[ToolSpec] = Registry("tools")  # the built-in suite's tools: eu_audit.plugins.DATASETS


def tool(
    name: str,
    description: str,
    params: dict[str, str],
    *,
    consequential: bool = False,
    identifier_args: tuple[str, ...] = (),
) -> Callable[[ToolFn], ToolFn]:
    """Decorator: register ``fn(env, args) -> result`` as a tool."""

    @forwards_registration
    def deco(fn: ToolFn) -> ToolFn:
        TOOLS.add(name, ToolSpec(name, description, params, consequential, identifier_args, fn))
        return fn

    return deco


class ToolError(Exception):
    pass


#: A toolset maps tool names to specs. ``builtin`` is the ``TOOLS`` registry; each data set's
#: environment adaptor (AgentDojo, BFCL) registers its own, so an episode names the toolset its tools
#: come from.
TOOLSETS: Registry[Callable[[], Mapping[str, ToolSpec]]] = Registry("toolsets")
TOOLSETS.add("builtin", lambda: dict(TOOLS.items()))


#: The shape of a toolset's environment (an episode's ``env``), checked when the episode is loaded, so a
#: bad spec is refused with its file and line before any model runs. Keyed by toolset name.
ENVIRONMENTS: Registry[type[BaseModel]] = Registry("toolset_envs")


@cache
def load_toolset(name: str) -> Mapping[str, ToolSpec]:
    return TOOLSETS.get(name)()


_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def parse_tool_calls(text: str) -> list[tuple[str, dict[str, Any] | None, str]]:
    """Find ``<tool_call>{json}</tool_call>`` spans. Returns (name, arguments or None, raw) per call;
    small models often stop before closing the JSON, so we try the closings they typically omit."""
    calls: list[tuple[str, dict[str, Any] | None, str]] = []
    for m in _CALL.finditer(text):
        raw = m.group(1).strip()
        obj = None
        for tail in ("", "}", '"}', "}}", '"}}', '"}}}'):
            try:
                obj = json.loads(raw + tail)
                break
            except json.JSONDecodeError:
                continue
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            args = obj.get("arguments")
            calls.append((obj["name"], args if isinstance(args, dict) else {}, raw))
        else:
            name = re.search(r'"name"\s*:\s*"([^"]+)"', raw)
            calls.append((name.group(1) if name else "", None, raw))
    return calls
