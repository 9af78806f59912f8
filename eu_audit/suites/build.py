"""``eu-audit suites build``: builders turn a data set into episodes under the knobs, reproducibly.

A builder is ``fn(knobs) -> list[Episode]`` registered with ``@BUILDERS.register("name")``; the same
knobs and seed give byte-identical output. Built suites live in ``suites/<name>.jsonl``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

from eu_audit.episodes import Episode
from eu_audit.errors import BadInput
from eu_audit.jsonl import atomic_writer
from eu_audit.registry import Registry
from eu_audit.suites.compose import Knobs

BUILDERS: Registry[Callable[[Knobs], list[Episode]]] = Registry("suite builders")


def rng_for(knobs: Knobs, *salt: object) -> random.Random:
    """One deterministic stream per (seed, salt): adding an episode never shifts another's draws."""
    return random.Random(repr((knobs.seed, *salt)))


def build_suite(name: str, knobs: Knobs) -> list[Episode]:
    _load_builders()
    episodes = BUILDERS.get(name)(knobs)
    return episodes[: knobs.n] if knobs.n else episodes


def write_suite(episodes: list[Episode], out: Path, *, force: bool = False) -> Path:
    if out.exists() and not force:
        raise BadInput(f"{out} exists; pass --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(out, private=False) as f:
        for ep in episodes:
            f.write(episode_line(ep))
    return out


def episode_line(ep: Episode) -> str:
    data = ep.model_dump(mode="json", exclude_defaults=True)
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n"


def _load_builders() -> None:
    import eu_audit.suites.agentdojo
    import eu_audit.suites.bfcl
    import eu_audit.suites.preference  # noqa: F401
