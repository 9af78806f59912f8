"""One folder per data set: its environment adaptor (the tools and how they run offline), its episode
builder or loader, and its own utility check where it has one.

| folder | what |
|---|---|
| ``builtin/`` | the tools of the hand-written ``builtin`` suite |
| ``agentdojo/`` | AgentDojo 0.1.35 (suites v1.2.2): environments and tools, episode builder, utility check |
| ``bfcl/`` | BFCL v4 (``bfcl-eval``): deterministic backends, ``bfcl-memory`` and ``bfcl-tools`` builders |
| ``preference/`` | the behavioral preference suite's builder |
| ``longmemeval/`` | a loader for the user's copy of LongMemEval |

A data set is one object, ``DataSet``: its modules by the registry they register into (``TOOLSETS``,
``BUILDERS``, ``LOADERS``, ``UTILITY_CHECKS``, ...; a registry imports them by name on first use) and the
suites shipped from it. ``DATASETS`` holds them; a new data set is one more ``DataSet`` (from another
package: ``add_data_set`` in a module of the ``eu_audit.plugins`` entry-point group). The built episode
files (data) live in the repository's ``suites/`` folder; the generic suite machinery (knobs,
composition, loading) is ``eu_audit.suites``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

#: what a data set's counterfactual world shows where the target was withheld (one text for every data set)
WITHHELD = "[withheld]"


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
    DATASETS[ds.name] = ds


def modules_for(kind: str) -> tuple[str, ...]:
    """The data sets' modules that register into the registry of ``kind``, in the data sets' order. Not
    a ``Registry`` itself: the registries read it while they load, so it must not load anything."""
    return tuple(m for ds in DATASETS.values() for m in ds.provides.get(kind, ()))
