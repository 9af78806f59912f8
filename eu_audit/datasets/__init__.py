"""One folder per data set: its environment adaptor (the tools and how they run offline), its episode
builder or loader, and its own utility check where it has one.

| folder | what |
|---|---|
| ``builtin/`` | the tools of the hand-written ``builtin`` suite |
| ``agentdojo/`` | AgentDojo 0.1.35 (suites v1.2.2): environments and tools, episode builder, utility check |
| ``bfcl/`` | BFCL v4 (``bfcl-eval``): deterministic backends, ``bfcl-memory`` and ``bfcl-tools`` builders |
| ``preference/`` | the behavioral preference suite's builder |
| ``longmemeval/`` | a loader for the user's copy of LongMemEval |

Each module registers itself into the registries (``TOOLSETS``, ``BUILDERS``, ``LOADERS``,
``UTILITY_CHECKS``, ...), which import it by name on first use. ``PLUGINS`` below is the one list of them:
a new data set adds its modules there (or, from another package, to the ``eu_audit.<kind>`` entry-point
group). The built episode files (data) live in the repository's ``suites/`` folder; the generic suite
machinery (knobs, composition, loading) is ``eu_audit.suites``.
"""

#: what a data set's counterfactual world shows where the target was withheld (one text for every data set)
WITHHELD = "[withheld]"

#: registry kind -> the data sets' modules that register into it (loaded by the registry on first use)
PLUGINS: dict[str, tuple[str, ...]] = {
    "tools": ("eu_audit.datasets.builtin.tools",),
    "toolsets": ("eu_audit.datasets.agentdojo.env", "eu_audit.datasets.bfcl.env"),
    "toolset_envs": (
        "eu_audit.datasets.builtin.tools",
        "eu_audit.datasets.agentdojo.env",
        "eu_audit.datasets.bfcl.env",
    ),
    "suite_builders": (
        "eu_audit.datasets.agentdojo.builder",
        "eu_audit.datasets.bfcl.builders",
        "eu_audit.datasets.preference.builder",
    ),
    "suite_loaders": ("eu_audit.datasets.longmemeval.loader",),
    "utility_checks": ("eu_audit.datasets.agentdojo.utility",),
    "security_checks": ("eu_audit.datasets.agentdojo.utility",),
}
