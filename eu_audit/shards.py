"""Shards: one run's sessions split across machines, and joined back into the run it would have been.

``--shard I/N`` keeps session i (numbered across the whole run, suites in order) when i mod N = I - 1.
``--sessions FROM:TO`` keeps each suite's sessions FROM to TO - 1 (a run continued later: sessions 30:68
of ``--n 68`` join an earlier ``--n 30``'s audit of a single suite, whose sessions are the same).
A shard's sessions keep their run-wide number (``SessionRecord.index``), id (``s{i}``) and seed, so
session i is the same whichever shard ran it. ``merge`` joins shard bundles (the same model, engine,
decoding, suite and seed; no session twice) into one bundle; shard audits join in
``eu_audit.audits.merge``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from eu_audit.errors import BadInput

T = TypeVar("T")
_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
_SLICE = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")
#: header facts that legitimately differ between shards of one run (each serve, each run's own key)
PER_SHARD_FACTS = (
    "shard",
    "sessions",
    "serve_log_digest",
    "serve_control_key",
    "serve_info",
    "agent",
    "serve",
    "concurrency",  # how a shard was driven, not what it measured (attribution is the same)
)


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        m = _SHARD.match(text)
        if not m:
            raise BadInput(f"--shard {text!r}: expected I/N, e.g. 1/4")
        i, n = int(m.group(1)), int(m.group(2))
        if n < 1 or not 1 <= i <= n:
            raise BadInput(f"--shard {text}: I must be between 1 and N (N >= 1)")
        return cls(i, n)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def keeps(self, i: int) -> bool:
        return i % self.count == self.index - 1

    def select(self, items: Sequence[T]) -> list[tuple[int, T]]:
        """(run-wide index, item) of the items this shard runs."""
        return [(i, x) for i, x in enumerate(items) if self.keeps(i)]


@dataclass(frozen=True)
class SessionSlice:
    """``--sessions FROM:TO``: of each suite's sessions, those at positions FROM to TO - 1 (from 0),
    numbered as in the whole run of ``--n``, so a run is recorded in slices over days (each slice's audit
    kept, then ``eu-audit merge``) and a finished run continued to a larger n without recording again
    what it has. A single suite's session i is the same at any ``--n`` (its id, seed and episode); with
    several suites the numbers depend on ``--n``, so every slice of such a run gives the same ``--n``."""

    start: int
    stop: int

    @classmethod
    def parse(cls, text: str, n: int | None) -> SessionSlice:
        m = _SLICE.match(text)
        if not m:
            raise BadInput(
                f"--sessions {text!r}: expected FROM:TO, e.g. 30:68 (sessions 30 to 67 of each suite)"
            )
        start, stop = int(m.group(1)), int(m.group(2))
        if n is None:
            raise BadInput(f"--sessions {text}: needs --n, the run's sessions per suite that the slice is of")
        if not start < stop <= n:
            raise BadInput(f"--sessions {text}: FROM must be below TO, and TO at most --n ({n})")
        return cls(start, stop)

    def __str__(self) -> str:
        return f"{self.start}:{self.stop}"

    def keeps(self, position_in_suite: int) -> bool:
        return self.start <= position_in_suite < self.stop


def run_order(index: int | None, session_id: str) -> tuple[int, str]:
    """Where a session falls in its run: by its run-wide number, sessions without one last."""
    return (1 << 30 if index is None else index, session_id)


def check_same_run(headers: Sequence[tuple[Path, Any]]) -> None:
    """Shard headers agree on everything a session depends on; distinct shards of one N."""
    first_path, first = headers[0]
    keys = (
        "schema_version",
        "tool_version",
        "model",
        "engine",
        "decoding",
        "seed",
        "suite",
        "checkpoint_policy",
    )
    ref = first.model_dump(mode="json")
    shards = []
    for path, h in headers:
        d = h.model_dump(mode="json")
        for k in keys:
            if d[k] != ref[k]:
                raise BadInput(
                    f"its {k} differs from {first_path}'s: not a shard of the same run", path=str(path)
                )
        facts = {k: v for k, v in d["engine_facts"].items() if k not in PER_SHARD_FACTS}
        if facts != {k: v for k, v in ref["engine_facts"].items() if k not in PER_SHARD_FACTS}:
            raise BadInput(f"its engine facts differ from {first_path}'s: not the same run", path=str(path))
        shards.append(d["engine_facts"].get("shard"))
    given = [s for s in shards if s]
    if given and len(set(given)) != len(given):
        raise BadInput(f"the same shard appears twice ({', '.join(sorted(given))})")
    if given and len({s.split("/")[1] for s in given}) > 1:
        raise BadInput(f"shards of different splits ({', '.join(sorted(given))})")


def merge_bundles(paths: Sequence[Path], out: Path, *, force: bool = False) -> Path:
    """Shard bundles -> one bundle (sessions in run order), refused before anything is written when they
    are not shards of one run or a session appears twice."""
    from eu_audit.bundle.io import read_bundle, write_bundle
    from eu_audit.jsonl import check_output_path
    from eu_audit.trace.session import Bundle

    if len(paths) < 2:
        raise BadInput("merge needs at least two files")
    check_output_path(out, force=force)
    bundles = [read_bundle(p) for p in paths]
    check_same_run([(p, b.header) for p, b in zip(paths, bundles, strict=True)])
    seen: dict[str, Path] = {}
    for p, b in zip(paths, bundles, strict=True):
        for s in b.sessions:
            if s.session_id in seen:
                raise BadInput(
                    f"session '{s.session_id}' is also in {seen[s.session_id]} (overlapping shards)",
                    path=str(p),
                )
            seen[s.session_id] = p
    facts = {k: v for k, v in bundles[0].header.engine_facts.items() if k not in PER_SHARD_FACTS}
    facts["merged_from"] = [b.digest for b in bundles]
    header = bundles[0].header.model_copy(update={"engine_facts": facts})
    sessions = sorted(
        (s for b in bundles for s in b.sessions), key=lambda s: run_order(s.session.index, s.session_id)
    )
    write_bundle(out, Bundle(header=header, sessions=sessions, path=out).records())
    return out


def shard_bundle(path: Path, shard: Shard) -> Path:
    """The sessions of ``path`` that fall in ``shard`` (a post-forget state goes with its recorded
    session), as a bundle of its own beside the input: ``<stem>.shard-I-of-N.jsonl``, derived
    deterministically from the input and replaced on each run."""
    from eu_audit.bundle.io import read_bundle, write_bundle
    from eu_audit.trace.session import Bundle

    bundle = read_bundle(path)
    kept = [s for s in bundle.sessions if shard.keeps(run_order(s.session.index, s.session_id)[0])]
    if not kept:
        raise BadInput(f"--shard {shard}: no session of this bundle falls in this shard", path=str(path))
    out = path.with_name(f"{path.stem}.shard-{shard.index}-of-{shard.count}{path.suffix or '.jsonl'}")
    facts = {**bundle.header.engine_facts, "shard": str(shard)}
    header = bundle.header.model_copy(update={"engine_facts": facts})
    write_bundle(out, Bundle(header=header, sessions=kept, path=out).records())
    return out
