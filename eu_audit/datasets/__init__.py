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
``UTILITY_CHECKS``), which import it by name on first use. The built episode files (data) live in the
repository's ``suites/`` folder; the generic suite machinery (knobs, composition, loading) is
``eu_audit.suites``.
"""
