"""BFCL's multi-turn tool backends, run offline (``bfcl-eval`` on PyPI, Apache-2.0).

An episode's ``env`` is JSON: ``{"bfcl": {"scenario": <multi_turn_base id>}, "log": [[name, args],
...], "withhold": [...]}``. The backends (file system, travel, trading, tickets, messages, ...) are
deterministic Python classes seeded from the scenario's initial config; every call rebuilds them from a
deep copy of that config and replays the logged state-changing calls, so the environment is a plain
value. ``withhold`` lists strings the world never showed the agent: they are cut out of every tool
result (the counterfactual world of a tool-observed identifier).
"""

from __future__ import annotations

import copy
import importlib
import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import to_jsonable_python

from eu_audit.datasets import WITHHELD
from eu_audit.errors import BadInput
from eu_audit.runtime.tools import ENVIRONMENTS, TOOLSETS, ToolError, ToolFn, ToolSpec

#: func-doc file -> backend class, as in bfcl_eval.constants.executable_backend_config
CLASSES = {
    "gorilla_file_system": "GorillaFileSystem",
    "math_api": "MathAPI",
    "message_api": "MessageAPI",
    "posting_api": "TwitterAPI",
    "ticket_api": "TicketAPI",
    "trading_bot": "TradingBot",
    "travel_booking": "TravelAPI",
    "vehicle_control": "VehicleControlAPI",
}
_READ_PREFIXES = (
    "get_",
    "list_",
    "display_",
    "view_",
    "retrieve_",
    "check_",
    "search_",
    "filter_",
    "estimate_",
    "compare_",
    "compute_",
    "find_",
)
#: read-only functions whose names carry no read prefix (file inspection, MathAPI, converters)
_READ_NAMES = frozenset(
    {
        "ls",
        "cat",
        "find",
        "grep",
        "pwd",
        "du",
        "wc",
        "tail",
        "diff",
        "mean",
        "median",
        "standard_deviation",
        "absolute_value",
        "add",
        "subtract",
        "multiply",
        "divide",
        "power",
        "square_root",
        "logarithm",
        "percentage",
        "min_value",
        "max_value",
        "sum_values",
        "round_number",
        "si_unit_conversion",
        "imperial_si_conversion",
        "gallon_to_liter",
        "liter_to_gallon",
    }
)
_IDENTIFIER_HINTS = ("id", "name", "symbol", "iban", "account", "card", "user", "receiver", "file", "ticket")


def data_root() -> Path:
    try:
        return Path(str(resources.files("bfcl_eval") / "data"))
    except ModuleNotFoundError as exc:
        raise BadInput("the BFCL suites need the 'bfcl-eval' package (see the README)") from exc


@cache
def func_docs() -> dict[str, tuple[str, dict[str, Any]]]:
    """tool name -> (backend class, BFCL function doc)."""
    docs: dict[str, tuple[str, dict[str, Any]]] = {}
    for stem, cls in CLASSES.items():
        for line in (data_root() / "multi_turn_func_doc" / f"{stem}.json").read_text().splitlines():
            if line.strip():
                doc = json.loads(line)
                docs[doc["name"]] = (cls, doc)
    return docs


@cache
def scenarios() -> dict[str, dict[str, Any]]:
    path = data_root() / "BFCL_v4_multi_turn_base.json"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["id"]: r for r in rows}


@cache
def ground_truth() -> dict[str, list[list[str]]]:
    path = data_root() / "possible_answer" / "BFCL_v4_multi_turn_base.json"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["id"]: r["ground_truth"] for r in rows}


def call_is_consequential(name: str) -> bool:
    return name not in _READ_NAMES and not name.startswith(_READ_PREFIXES)


def backends(scenario_id: str, log: list[Any] | tuple[Any, ...] = ()) -> dict[str, Any]:
    """Fresh backend instances for a scenario (initial config deep-copied), with ``log`` replayed."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    try:
        scenario = scenarios()[scenario_id]
    except KeyError:
        raise BadInput(f"unknown BFCL multi-turn scenario '{scenario_id}'") from None
    config = copy.deepcopy(scenario.get("initial_config", {}))
    live = {}
    for cls in scenario["involved_classes"]:
        obj = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[cls]), cls)()
        if hasattr(obj, "_load_scenario"):
            obj._load_scenario(config.get(cls, {}))
        live[cls] = obj
    for name, args in log:
        call(live, name, args)
    return live


def call(live: dict[str, Any], name: str, args: dict[str, Any]) -> Any:
    cls, _ = func_docs()[name]
    if cls not in live:
        raise ToolError(f"{name} is not available in this scenario")
    try:
        result = getattr(live[cls], name)(**args)
    except TypeError as exc:
        raise ToolError(f"bad arguments for {name}: {exc}") from None
    return to_jsonable_python(result, fallback=str)


def withhold(value: Any, hidden: list[str]) -> Any:
    """``value`` with every occurrence of a hidden string cut out (numbers equal to one replaced)."""
    if isinstance(value, dict):
        return {withhold(k, hidden): withhold(v, hidden) for k, v in value.items()}
    if isinstance(value, list):
        return [withhold(v, hidden) for v in value]
    if isinstance(value, str):
        for h in hidden:
            value = value.replace(h, WITHHELD)
        return value
    if not isinstance(value, bool) and isinstance(value, int | float) and str(value) in hidden:
        return WITHHELD
    return value


def run_call(env: dict[str, Any], name: str, args: dict[str, Any]) -> Any:
    log = env.setdefault("log", [])
    live = backends(env["bfcl"]["scenario"], log)
    result = call(live, name, args)
    if call_is_consequential(name):
        log.append([name, dict(args)])
    return withhold(result, env.get("withhold", []))


def _toolset() -> dict[str, ToolSpec]:
    specs = {}
    for name, (_cls, doc) in func_docs().items():
        props = doc.get("parameters", {}).get("properties", {})
        params = {p: str(v.get("type", "any")) for p, v in props.items()}
        desc = doc.get("description", "").split("Tool description:")[-1].strip()
        specs[name] = ToolSpec(
            name=name,
            description=desc,
            params=params,
            consequential=call_is_consequential(name),
            identifier_args=tuple(p for p in params if any(h in p.lower() for h in _IDENTIFIER_HINTS)),
            fn=_bound(name),
        )
    return specs


def _bound(name: str) -> ToolFn:
    return lambda env, args: run_call(env, name, args)


class BfclSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scenario: str

    @field_validator("scenario")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in scenarios():
            raise ValueError(f"unknown BFCL multi-turn scenario '{value}'")
        return value


class BfclEnv(BaseModel):
    """An episode's BFCL world: the scenario whose backends run, the logged effects, what is withheld."""

    model_config = ConfigDict(extra="forbid")

    bfcl: BfclSpec
    log: list[tuple[str, dict[str, Any]]] = Field(default_factory=list)
    withhold: list[str] = Field(default_factory=list)


TOOLSETS.add("bfcl", _toolset)
ENVIRONMENTS.add("bfcl", BfclEnv)
