"""Tools the agent can call. Each is read-only (safe to re-run from an environment snapshot) or
consequential (a real side effect, written to the outbox; replay shadow-executes it)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from eu_audit.registry import Registry

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


TOOLS: Registry[ToolSpec] = Registry("tools")


def tool(
    name: str,
    description: str,
    params: dict[str, str],
    *,
    consequential: bool = False,
    identifier_args: tuple[str, ...] = (),
) -> Callable[[ToolFn], ToolFn]:
    """Decorator: register ``fn(env, args) -> result`` as a tool."""

    def deco(fn: ToolFn) -> ToolFn:
        TOOLS.add(name, ToolSpec(name, description, params, consequential, identifier_args, fn))
        return fn

    return deco


class ToolError(Exception):
    pass


#: A toolset maps tool names to specs. ``builtin`` is the ``TOOLS`` registry; data-set adaptors
#: (AgentDojo, BFCL) register theirs, so an episode names the toolset its tools come from.
TOOLSETS: Registry[Callable[[], Mapping[str, ToolSpec]]] = Registry("toolsets")
TOOLSETS.add("builtin", lambda: dict(TOOLS.items()))


@cache
def load_toolset(name: str) -> Mapping[str, ToolSpec]:
    _register_adaptors()
    return TOOLSETS.get(name)()


def _register_adaptors() -> None:
    """The data-set adaptors register their toolsets on import (their packages load lazily)."""
    import eu_audit.runtime.agentdojo_env
    import eu_audit.runtime.bfcl_env  # noqa: F401


def _lookup(env: dict[str, Any], table: str, key: str) -> Any:
    rows = env.get(table, {})
    for k, v in rows.items():
        if k.lower() == str(key).lower():
            return v
    raise ToolError(f"no entry '{key}' in {table}")


@tool("get_payee", "look up a saved payee's bank details", {"name": "str"})
def _get_payee(env: dict[str, Any], args: dict[str, Any]) -> Any:
    return _lookup(env, "payees", args.get("name", ""))


@tool("lookup_contact", "look up a contact's details", {"name": "str"})
def _lookup_contact(env: dict[str, Any], args: dict[str, Any]) -> Any:
    return _lookup(env, "contacts", args.get("name", ""))


@tool("search_places", "search nearby places (restaurants, clinics, shops)", {"query": "str"})
def _search_places(env: dict[str, Any], args: dict[str, Any]) -> Any:
    q = str(args.get("query", "")).lower()
    return [p for p in env.get("places", []) if any(w in p.lower() for w in q.split())][:3]


@tool(
    "transfer",
    "send money to an IBAN",
    {"iban": "str", "amount": "float"},
    consequential=True,
    identifier_args=("iban",),
)
def _transfer(env: dict[str, Any], args: dict[str, Any]) -> Any:
    env.setdefault("transactions", []).append({"iban": args.get("iban"), "amount": args.get("amount")})
    return {"status": "sent", "n": len(env["transactions"])}


@tool(
    "send_email",
    "send an e-mail",
    {"to": "str", "subject": "str", "body": "str"},
    consequential=True,
    identifier_args=("to",),
)
def _send_email(env: dict[str, Any], args: dict[str, Any]) -> Any:
    env.setdefault("sent", []).append({k: args.get(k) for k in ("to", "subject")})
    return {"status": "sent"}


@tool(
    "book_taxi",
    "book a taxi",
    {"pickup": "address", "destination": "str", "time": "str"},
    consequential=True,
    identifier_args=("pickup", "destination"),
)
def _book_taxi(env: dict[str, Any], args: dict[str, Any]) -> Any:
    env.setdefault("bookings", []).append({k: args.get(k) for k in ("pickup", "destination", "time")})
    return {"status": "booked"}


@tool(
    "book_service",
    "book a provider (airline, taxi, courier, clinic, ...) for a date",
    {"provider": "str", "date": "str"},
    consequential=True,
    identifier_args=("provider",),
)
def _book_service(env: dict[str, Any], args: dict[str, Any]) -> Any:
    env.setdefault("bookings", []).append({k: args.get(k) for k in ("provider", "date")})
    return {"status": "booked", "provider": args.get("provider")}


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
