"""Suites: named collections of episodes. Episodes are data (JSONL in ``suites/``), validated line by
line; a suite can also be registered in code (``@SUITES.register("name")`` on a loader function)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pydantic import TypeAdapter

from eu_audit.episodes import Episode
from eu_audit.errors import BadInput
from eu_audit.jsonl import iter_jsonl
from eu_audit.plugins import SHIPPED as SHIPPED  # re-exported: the suite names
from eu_audit.registry import Registry

SUITES: Registry[Callable[[], list[Episode]]] = Registry("suites")
_EPISODE = TypeAdapter(Episode)


def data_dir(kind: str) -> Path:
    """``suites/`` or ``probes/``: inside the wheel, or at the repository root in a source checkout."""
    here = Path(__file__).resolve().parent.parent  # the eu_audit package
    for cand in (here / "_data" / kind, here.parent / kind):
        if cand.is_dir():
            return cand
    raise FileNotFoundError(f"eu-audit data folder '{kind}' is missing from this installation")


def load_episodes(path: str | Path, *, check_tools: bool = True) -> list[Episode]:
    """Every line validated as an episode and checked against the toolsets (tools, environment schema),
    so a bad step is refused here, with its file and line, not when a run reaches it. ``check_tools=False``
    skips the toolset check (it imports AgentDojo, seconds): for listing, never before a run."""
    from eu_audit.suites.checks import EpisodeProblem, check_episode

    path = Path(path)
    episodes: list[Episode] = []
    seen: set[str] = set()
    for line, ep in iter_jsonl(path, _EPISODE):
        if ep.id in seen:
            raise BadInput(f"episode id '{ep.id}' appears twice", path=str(path), line=line, field="id")
        seen.add(ep.id)
        try:
            if check_tools:
                check_episode(ep)
        except EpisodeProblem as exc:
            raise BadInput(str(exc), path=str(path), line=line, field=exc.field) from None
        episodes.append(ep)
    if not episodes:
        raise BadInput("no episodes in the file", path=str(path))
    return episodes


def shipped_file(name: str) -> Path:
    return data_dir("suites") / f"{name}.jsonl"


def _file_suite(name: str) -> Callable[[], list[Episode]]:
    return lambda: load_episodes(shipped_file(name))


# the suites shipped as data (``eu_audit.plugins.SHIPPED``, built by ``eu-audit suites build NAME``)
for _name in SHIPPED:
    SUITES.add(_name, _file_suite(_name))

#: loaders for data sets users bring: ``--suite longmemeval:/path/to/longmemeval_s.json``
LOADERS: Registry[Callable[[Path], list[Episode]]] = Registry("suite_loaders")


def load_suite(ref: str) -> list[Episode]:
    """A registered suite name, ``loader:PATH`` for a user-supplied data set, or an episodes JSONL."""
    p = Path(ref)
    if ref not in SUITES and (p.suffix == ".jsonl" or p.exists()):
        return load_episodes(p)
    if ":" in ref and ref not in SUITES:
        loader, _, path = ref.partition(":")
        return LOADERS.get(loader)(Path(path).expanduser())
    return SUITES.get(ref)()
