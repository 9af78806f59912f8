"""One folder per data set: its environment adaptor (the tools and how they run offline), its episode
builder or loader, and its own utility check where it has one.

| folder | what |
|---|---|
| ``builtin/`` | the tools of the hand-written ``builtin`` suite |
| ``agentdojo/`` | AgentDojo 0.1.35 (suites v1.2.2): environments and tools, episode builder, utility check |
| ``bfcl/`` | BFCL v4 (``bfcl-eval``): deterministic backends, ``bfcl-memory`` and ``bfcl-tools`` builders |
| ``preference/`` | the behavioral preference suite's builder |
| ``longmemeval/`` | a loader for the user's copy of LongMemEval |

A data set is one object, ``eu_audit.plugins.DataSet``: its modules by the registry they register into
(``TOOLSETS``, ``BUILDERS``, ``LOADERS``, ``UTILITY_CHECKS``, ...; a registry imports them by name on first
use) and the suites shipped from it. ``eu_audit.plugins.BUILT_IN`` lists these five; a new data set is one
more ``DataSet`` (from another package: ``add_data_set`` in a module of the ``eu_audit.plugins``
entry-point group). Nothing here is imported by the registries: the data sets sit above everything they
register into. The built episode files (data) live in the repository's ``suites/`` folder; the generic
suite machinery (knobs, composition, loading) is ``eu_audit.suites``.
"""

from __future__ import annotations

#: what a data set's counterfactual world shows where the target was withheld (one text for every data set)
WITHHELD = "[withheld]"
