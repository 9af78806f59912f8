"""Engines: where a state's tokens go through a model. ``base`` says what an engine is (the protocol,
its abilities, the registry), ``schedule`` writes the canonical schedule once, and each backend (``hf``,
``llamacpp``, ``served``) implements only its primitives. A new engine registers itself with
``@ENGINES.register(name)`` (or the ``eu_audit.engines`` entry-point group) and subclasses
``LocalEngine``; the exactness tests then run against it like against the built-in ones."""

from eu_audit.engines.base import (
    AUTO,
    ENGINES,
    Abilities,
    Branch,
    KVEngine,
    Sampling,
    TokenAccount,
    abilities_of,
    open_engine,
    resolve_engine,
)
from eu_audit.engines.schedule import LocalEngine, Schedule

__all__ = [
    "AUTO",
    "ENGINES",
    "Abilities",
    "Branch",
    "KVEngine",
    "LocalEngine",
    "Sampling",
    "Schedule",
    "TokenAccount",
    "abilities_of",
    "open_engine",
    "resolve_engine",
]
