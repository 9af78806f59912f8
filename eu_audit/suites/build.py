"""``eu-audit suites build``: builders turn a data set into episodes under the knobs, reproducibly.

A builder is ``fn(knobs, skips) -> list[Episode]`` registered with ``@BUILDERS.register("name")``; the
same knobs and seed give byte-identical output. A builder catches only the failures it expects from its
data set (a reference call that errors, an item without a usable target) and counts each item it leaves
out in ``skips`` by reason; ``suites build`` prints the counts. Built suites live in ``suites/<name>.jsonl``
(mode 0600: they hold the targets).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from eu_audit.episodes import Episode
from eu_audit.errors import BadInput
from eu_audit.jsonl import atomic_writer
from eu_audit.registry import Registry
from eu_audit.suites.compose import Knobs


class Skips(Counter[str]):
    """Data-set items a builder left out, counted by reason."""

    def lines(self) -> list[str]:
        return [f"{n} skipped: {reason}" for reason, n in sorted(self.items())]


#: the data sets' builders (each ``eu_audit.datasets.DataSet`` names its modules)
BUILDERS: Registry[Callable[[Knobs, Skips], list[Episode]]] = Registry("suite_builders")


def rng_for(knobs: Knobs, *salt: object) -> random.Random:
    """One deterministic stream per (seed, salt): adding an episode never shifts another's draws."""
    return random.Random(repr((knobs.seed, *salt)))


def build_suite(name: str, knobs: Knobs, skips: Skips | None = None) -> list[Episode]:
    episodes = BUILDERS.get(name)(knobs, skips if skips is not None else Skips())
    return episodes[: knobs.n] if knobs.n else episodes


def write_suite(episodes: list[Episode], out: Path, *, force: bool = False) -> Path:
    if out.exists() and not force:
        raise BadInput(f"{out} exists; pass --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(out, private=True) as f:
        for ep in episodes:
            f.write(episode_line(ep))
    return out


def episode_line(ep: Episode) -> str:
    data = ep.model_dump(mode="json", exclude_defaults=True)
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n"
