"""A recording's plan, made and checked once before any model or agent runs, for both sides
(``eu_audit.record`` on the white box, ``eu_audit.blackbox.drive`` on an agent): the run's episodes
(``n`` from each suite, in order), the sessions this shard runs with their run-wide index, where the
bundle goes, and the state folder beside it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from eu_audit.episodes import Episode
from eu_audit.errors import BadInput
from eu_audit.jsonl import check_output_path
from eu_audit.shards import SessionSlice, Shard
from eu_audit.suites import load_suite
from eu_audit.trace.records import session_id_of


class RunOptions(Protocol):
    """What a plan is made from, on either side (``RecordOptions``, ``AgentRecordOptions``)."""

    suite: str
    n: int | None
    out: Path
    state_dir: Path | None
    shard: Shard | None
    sessions: SessionSlice | None
    force: bool
    only: frozenset[int] | None


@dataclass(frozen=True)
class PlannedSession:
    """One session of the run: its run-wide index (the same whichever shard runs it, so its id and seed
    are too) and its episode."""

    index: int
    episode: Episode

    @property
    def session_id(self) -> str:
        return session_id_of(self.index)


@dataclass(frozen=True)
class RunPlan:
    episodes: tuple[Episode, ...]  # the whole run's, every shard's
    sessions: tuple[PlannedSession, ...]  # the ones this shard runs, in run order
    out: Path
    state_dir: Path

    def position_in_suite(self, index: int) -> int:
        """Where session ``index`` falls among its suite's sessions (0 for each suite's first)."""
        return _position(self.episodes, index)

    @classmethod
    def of(cls, opts: RunOptions) -> RunPlan:
        """The plan of a run's options (``make`` with each of them)."""
        return cls.make(
            opts.suite,
            opts.n,
            opts.out,
            state_dir=opts.state_dir,
            shard=opts.shard,
            force=opts.force,
            only=opts.only,
            sessions=opts.sessions,
        )

    @classmethod
    def make(
        cls,
        suite: str,
        n: int | None,
        out: Path,
        *,
        state_dir: Path | None,
        shard: Shard | None,
        force: bool,
        only: frozenset[int] | None = None,
        sessions: SessionSlice | None = None,
    ) -> RunPlan:
        """Check everything a recording can check before it runs: the output can be written (and is not
        replaced without ``force``), the state folder is not a file, every suite loads, ``n`` is at least 1
        and the shard has a session. ``only``: of those, the sessions with these run-wide indices (a round
        of a run in rounds, ``eu_audit.rounds``); ``sessions``: those at these positions in their suite."""
        out = Path(out)
        check_output_path(out, force=force)  # an unwritable -o is refused now, not after every session ran
        state = Path(state_dir) if state_dir else out.with_name(out.name + ".state")
        if state.exists() and not state.is_dir():
            raise BadInput("the state folder is a file", path=str(state))
        # "agentdojo,preference": n episodes from each suite, in order
        refs = [ref.strip() for ref in suite.split(",") if ref.strip()]
        if not refs:
            raise BadInput("--suite names no suite")
        episodes = tuple(ep for ref in refs for ep in pick_episodes(load_suite(ref), n))
        chosen = shard.select(episodes) if shard else list(enumerate(episodes))
        if only is not None:
            chosen = [(i, ep) for i, ep in chosen if i in only]
        if sessions is not None:
            chosen = [(i, ep) for i, ep in chosen if sessions.keeps(_position(episodes, i))]
        if not chosen:
            parts = " and ".join(
                f"{name} {part}" for name, part in (("--shard", shard), ("--sessions", sessions)) if part
            )
            raise BadInput(f"{parts or 'the run'}: no session of the {len(episodes)} falls in it")
        return cls(episodes, tuple(PlannedSession(i, ep) for i, ep in chosen), out, state)


def _position(episodes: tuple[Episode, ...], index: int) -> int:
    suite = episodes[index].suite
    return sum(1 for ep in episodes[:index] if ep.suite == suite)


def pick_episodes(episodes: list[Episode], n: int | None) -> list[Episode]:
    """The first ``n`` episodes, cycling through the suite when ``n`` exceeds its size."""
    if n is None:
        return episodes
    if n < 1:
        raise BadInput("--n must be at least 1")
    return [episodes[i % len(episodes)] for i in range(n)]
