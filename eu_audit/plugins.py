"""The one list of eu-audit's extension points: every registry a user can add to without editing eu-audit,
what each holds, and how a package plugs in.

Each extension point is a ``Registry`` (``eu_audit.registry``) named here by where it lives, so this
module imports none of them (no import cycle): a registry fills itself on first use from its built-in
modules, then from installed packages. A package plugs in one of two ways:

- **one module for everything** (recommended): an entry point in the group ``eu_audit.plugins`` naming a
  module; eu-audit imports it once, before any registry's first use, and the module registers what it
  adds with the decorators below (``@METHODS.register("mine")``, ``@METRICS.register(...)``, ...);
- per kind: an entry point in the group ``eu_audit.<kind>`` (``eu_audit.methods``), loaded when that
  registry is first used (kept for plugins written before the one group).

``pyproject.toml`` of a plugin package::

    [project.entry-points."eu_audit.plugins"]
    mine = "my_package.eu_audit_plugin"

A data set (a folder under ``eu_audit/datasets/``) is one ``DataSet`` here: the modules that register its
parts, by registry kind, which each registry imports by name on first use, and the suites it ships.

``docs/library.md`` lists the same table (``extension_points_table``; a test keeps the two equal).

What was loaded is on the record: ``LOADED`` (each plug-in's distribution and version), and each registry
entry's defining module (``Registry.origins``); an audit and its signed receipt name both, and
``eu-audit plugins`` lists them. ``EU_AUDIT_NO_PLUGINS=1`` runs with eu-audit's built-ins alone.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

#: the entry-point group a plugin package names its module in
GROUP = "eu_audit.plugins"


@dataclass(frozen=True)
class ExtensionPoint:
    """One registry a user adds to: where it lives, what it maps a name to, and what uses it."""

    registry: str  # "module:NAME"
    holds: str  # what one entry is
    used_by: str  # where eu-audit reads it (the command or the object)

    def resolve(self) -> Any:
        module, name = self.registry.split(":")
        return getattr(importlib.import_module(module), name)

    @property
    def name(self) -> str:
        return self.registry.split(":")[1]


#: every extension point, in the order a reader meets them (the paper's objects first)
EXTENSION_POINTS: tuple[ExtensionPoint, ...] = (
    ExtensionPoint("eu_audit.models:MODELS", "a `ModelSpec` (weights, tokenizer, family)", "`--model`"),
    ExtensionPoint(
        "eu_audit.engines.base:ENGINES",
        "an engine class (a KV-cache engine and its `Abilities`)",
        "`--engine`",
    ),
    ExtensionPoint(
        "eu_audit.methods.base:METHODS",
        "a `MethodSpec`: a forget method (the paper's B0-B9) and the abilities it needs",
        "`unlearn -m`, `audit -m`",
    ),
    ExtensionPoint(
        "eu_audit.suites:SUITES", "a suite: a function returning its episodes", "`record --suite`"
    ),
    ExtensionPoint(
        "eu_audit.suites.build:BUILDERS",
        "a suite builder: knobs and skips in, episodes out",
        "`eu-audit suites build`",
    ),
    ExtensionPoint(
        "eu_audit.suites:LOADERS", "a suite loader: a data file in, episodes out", "`--suite LOADER:PATH`"
    ),
    ExtensionPoint("eu_audit.runtime.tools:TOOLS", "a `ToolSpec` of the built-in suite", "episodes' tools"),
    ExtensionPoint(
        "eu_audit.runtime.tools:TOOLSETS",
        "a toolset: a function returning its tools (AgentDojo, BFCL)",
        "episodes' tools",
    ),
    ExtensionPoint(
        "eu_audit.runtime.tools:ENVIRONMENTS",
        "a toolset's environment model (the state its tools read and write)",
        "tool calls during replay",
    ),
    ExtensionPoint(
        "eu_audit.audits.metric:METRICS",
        "a `Metric` (keywords only): a measured quantity with its kind, direction, whether it needs a "
        "control and what a rule on it evidences in a receipt (`receipt`)",
        "`audit`, rules (`--gate`), receipts",
    ),
    ExtensionPoint("eu_audit.audits.probes:PROBES", "a `Probe`: a question that elicits z", "`audit`"),
    ExtensionPoint(
        "eu_audit.audits.metrics:UTILITY_CHECKS",
        "a data set's utility check (did the task succeed)",
        "`audit`",
    ),
    ExtensionPoint(
        "eu_audit.audits.metrics:SECURITY_CHECKS",
        "a data set's security check (did the injection's goal happen)",
        "`audit`",
    ),
    ExtensionPoint(
        "eu_audit.audits.gate:GATE_SETS", "a `GateSet`: a named list of rules", "`audit --gate-set`"
    ),
    ExtensionPoint(
        "eu_audit.blackbox.adapter:ADAPTERS",
        "an adapter: a URL in, an `AgentUnderTest` out (a stack eu-audit drives)",
        "`eu-audit gate`",
    ),
    ExtensionPoint(
        "eu_audit.tiers:RECHECKS",
        "a `Recheck`: an event after the forget (restart, compaction, more turns)",
        "`gate --recheck`",
    ),
    ExtensionPoint("eu_audit.sweeps:SWEEPS", "a `SweepSpec`: one of the paper's sweeps", "`eu-audit sweep`"),
)


@dataclass(frozen=True)
class DataSet:
    """One data set: the modules that register its parts, by registry kind, and the suites shipped from it
    (built into ``suites/NAME.jsonl`` by ``eu-audit suites build NAME``)."""

    name: str
    what: str
    #: registry kind (``Registry.kind``) -> the modules that register into it
    provides: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    suites: tuple[str, ...] = ()


#: the data sets eu-audit ships (``DATASETS`` holds them and any a plugin adds)
BUILT_IN: tuple[DataSet, ...] = (
    DataSet(
        "builtin",
        "the hand-written built-in suite's tools",
        {"tools": ("eu_audit.datasets.builtin.tools",), "toolset_envs": ("eu_audit.datasets.builtin.tools",)},
        suites=("builtin",),
    ),
    DataSet(
        "agentdojo",
        "AgentDojo 0.1.35 (suites v1.2.2): environments and tools, episode builder, utility and security "
        "checks",
        {
            "toolsets": ("eu_audit.datasets.agentdojo.env",),
            "toolset_envs": ("eu_audit.datasets.agentdojo.env",),
            "suite_builders": ("eu_audit.datasets.agentdojo.builder",),
            "utility_checks": ("eu_audit.datasets.agentdojo.utility",),
            "security_checks": ("eu_audit.datasets.agentdojo.utility",),
        },
        suites=("agentdojo",),
    ),
    DataSet(
        "bfcl",
        "BFCL v4 (bfcl-eval): deterministic backends, the bfcl-memory and bfcl-tools builders",
        {
            "toolsets": ("eu_audit.datasets.bfcl.env",),
            "toolset_envs": ("eu_audit.datasets.bfcl.env",),
            "suite_builders": ("eu_audit.datasets.bfcl.builders",),
        },
        suites=("bfcl-memory", "bfcl-tools"),
    ),
    DataSet(
        "preference",
        "the behavioral preference suite's builder",
        {"suite_builders": ("eu_audit.datasets.preference.builder",)},
        suites=("preference",),
    ),
    DataSet(
        "longmemeval",
        "a loader for the user's copy of LongMemEval (--suite longmemeval:PATH)",
        {"suite_loaders": ("eu_audit.datasets.longmemeval.loader",)},
    ),
)
#: name -> data set: the built-in ones, and any an installed package adds (``add_data_set``)
DATASETS: dict[str, DataSet] = {ds.name: ds for ds in BUILT_IN}
#: the suites shipped as data (``suites/NAME.jsonl``), from the built-in data sets
SHIPPED: tuple[str, ...] = tuple(s for ds in BUILT_IN for s in ds.suites)


def add_data_set(ds: DataSet) -> None:
    """Add a data set (from a module of the ``eu_audit.plugins`` entry-point group, which every registry
    loads before its own modules): its modules are then imported by the registries of their kinds."""
    if ds.name in DATASETS and DATASETS[ds.name] != ds:
        raise ValueError(f"data set '{ds.name}' is already registered")
    kinds = registry_kinds()
    wrong = sorted(set(ds.provides) - set(kinds))
    if wrong:  # a misspelt kind would be skipped by every registry: refused, naming the kinds there are
        raise ValueError(
            f"data set '{ds.name}': no registry of kind {', '.join(map(repr, wrong))} "
            f"(the kinds: {', '.join(kinds)})"
        )
    DATASETS[ds.name] = ds


def registry_kinds() -> list[str]:
    """Every extension point's kind (``eu_audit.<kind>``), in the table's order."""
    return [p.resolve().kind for p in EXTENSION_POINTS]


def modules_for(kind: str) -> tuple[str, ...]:
    """The data sets' modules that register into the registry of ``kind``, in the data sets' order. Not
    a ``Registry`` itself: the registries read it while they load, so it must not load anything."""
    return tuple(m for ds in DATASETS.values() for m in ds.provides.get(kind, ()))


_loaded = False
#: set (to anything but 0): no installed plug-in is loaded, eu-audit runs on its built-ins alone
NO_PLUGINS = "EU_AUDIT_NO_PLUGINS"


@dataclass(frozen=True)
class LoadedPlugin:
    """An entry point eu-audit loaded: its group and name, the module it names, and its distribution."""

    group: str
    name: str
    module: str
    dist: str  # "my-plugin==0.1.0" ("" when it came from no installed distribution)

    def said(self) -> str:
        return f"{self.dist or self.module} ({self.group}: {self.name})"


#: every plug-in loaded in this process, in load order (what audits, receipts and `eu-audit plugins` name)
LOADED: list[LoadedPlugin] = []


def plugins_off() -> bool:
    return os.environ.get(NO_PLUGINS, "") not in ("", "0")


def load_group(group: str) -> None:
    """Load every entry point of ``group`` (unless ``NO_PLUGINS`` is set), each kept in ``LOADED``."""
    if plugins_off():
        return
    for ep in entry_points(group=group):
        ep.load()
        dist = f"{ep.dist.name}=={ep.dist.version}" if ep.dist is not None else ""
        LOADED.append(LoadedPlugin(group, ep.name, ep.value, dist))


def load_plugins() -> None:
    """Import every module named in the ``eu_audit.plugins`` group, once; each registers what it adds.
    Called by every registry before it first loads (``Registry.load``)."""
    global _loaded
    if _loaded:
        return
    _loaded = True  # before importing: a plugin module that uses a registry must not re-enter
    load_group(GROUP)


def origin_of(module: str) -> str:
    """The distribution a registering module belongs to ("eu-audit", "my-plugin==0.1.0"), or the module
    itself when no installed distribution holds it (a script, a test)."""
    from importlib.metadata import packages_distributions, version

    top = module.split(".")[0]
    if top == "eu_audit":
        return "eu-audit"
    dists = packages_distributions().get(top) or []
    return f"{dists[0]}=={version(dists[0])}" if dists else module


def added_by_plugins() -> dict[str, str]:
    """Every registry entry not built into eu-audit ("metrics:mine") -> what defined it (its distribution,
    or its module): what an audit and a receipt say was not eu-audit's own."""
    out: dict[str, str] = {}
    for point in EXTENSION_POINTS:
        registry = point.resolve()
        for name, module in registry.origins().items():
            where = origin_of(module)
            if where != "eu-audit":
                out[f"{registry.kind}:{name}"] = where
    return out


def extension_points_table() -> str:
    """The extension points as the Markdown table ``docs/library.md`` shows."""
    rows = ["| registry | kind (`eu_audit.<kind>`) | one entry is | used by |", "|---|---|---|---|"]
    for p in EXTENSION_POINTS:
        module = p.registry.split(":")[0]
        kind = p.resolve().kind
        rows.append(f"| `{p.name}` (`{module}`) | `{kind}` | {p.holds} | {p.used_by} |")
    return "\n".join(rows)
