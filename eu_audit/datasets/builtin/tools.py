"""The built-in suite's tools: payees, contacts, places (read-only) and money, mail, taxis and bookings
(consequential, written to the outbox). The environment is the episode's ``env`` JSON."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from eu_audit.runtime.tools import ENVIRONMENTS, ToolError, tool


class BuiltinEnv(BaseModel):
    """The built-in tools' world: lookup tables, places, and the effects consequential tools logged."""

    model_config = ConfigDict(extra="forbid")

    payees: dict[str, Any] = Field(default_factory=dict)
    contacts: dict[str, Any] = Field(default_factory=dict)
    places: list[str] = Field(default_factory=list)
    transactions: list[dict[str, Any]] = Field(default_factory=list)
    sent: list[dict[str, Any]] = Field(default_factory=list)
    bookings: list[dict[str, Any]] = Field(default_factory=list)


ENVIRONMENTS.add("builtin", BuiltinEnv)


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
