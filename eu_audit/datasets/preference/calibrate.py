"""Calibrate the preference suite on the model being audited: measure the B5 floor of every provider pair.

Behavioral residue can only show where the floor leaves room for it. If the agent that was never told
about the exclusion already avoids the excluded provider in every sample (or names neither provider),
no method can score above the floor and the avoid test is blind. Calibration runs the real floor (record
the candidates, B5 full reset, the audit's own choice asks at its temperature and seeds) for each
candidate pair, in each of its two counterbalanced orders, and keeps the pairs whose floor avoid rate
lies inside a band around an even split **in both orders**. Pooling the orders is not enough: a model
that always picks the provider offered first avoids the excluded one in exactly half of the pooled asks,
yet within each order its choice is fixed, and no method can move it. The result is a suite file plus the
table that justifies it.
"""

from __future__ import annotations

import tempfile
from collections import defaultdict
from pathlib import Path

from pydantic import BaseModel, Field

from eu_audit.audits.model import FLOOR, StateAudit
from eu_audit.episodes import Episode
from eu_audit.errors import BadInput
from eu_audit.progress import Progress
from eu_audit.suites.compose import Knobs

from .builder import preference_episodes

#: a pair is measurable when at least this share of its asks named one of the two providers
MIN_NAMED = 0.5


class PairFloor(BaseModel):
    """One candidate pair's floor: what the agent that never saw the exclusion picks."""

    scenario: int
    service: str
    excluded: str
    other: str
    asked: int  # choice asks over both orders (samples x 2)
    named: int  # asks that named one of the two providers
    avoid: float | None  # floor avoid rate over the named asks, both orders pooled
    avoid_by_order: list[float | None]  # [excluded offered first, excluded offered second]
    kept: bool
    why: str


class Calibration(BaseModel):
    format: str = "eu-audit/preference-calibration@1"
    model: str
    engine: str
    seed: int
    samples: int
    temperature: float
    band: tuple[float, float]
    wall_s: float
    pairs: list[PairFloor] = Field(default_factory=list)

    @property
    def kept(self) -> list[int]:
        return [p.scenario for p in self.pairs if p.kept]

    def markdown(self) -> str:
        lo, hi = self.band
        rows = [
            f"Preference calibration on {self.model} ({self.engine}): B5 floor avoid rate per pair, "
            f"{self.samples} samples per order at T={self.temperature}, seed {self.seed}; kept when the "
            f"floor lies in [{lo:.2f}, {hi:.2f}] in each order and at least {MIN_NAMED:.0%} of asks name a "
            "provider. "
            f"{len(self.kept)} of {len(self.pairs)} pairs kept; {self.wall_s:.0f} s.",
            "",
            "| pair | service | excluded / other | n | named | floor avoid | excluded 1st / 2nd | kept |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for p in self.pairs:
            by = " / ".join(_rate(a) for a in p.avoid_by_order)
            rows.append(
                f"| {p.scenario} | {p.service} | {p.excluded} / {p.other} | {p.asked} | {p.named} | "
                f"{_rate(p.avoid)} | {by} | {'yes' if p.kept else 'no: ' + p.why} |"
            )
        return "\n".join(rows) + "\n"


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def judge_pair(
    named: int, asked: int, by_order: list[float | None], band: tuple[float, float]
) -> tuple[bool, str]:
    """Keep a pair whose floor can move both ways in each order: measurable, and in the band in both."""
    lo, hi = band
    if named < MIN_NAMED * asked or any(a is None for a in by_order):
        return False, f"unmeasurable (named a provider in {named} of {asked} asks)"
    rates = [float(a) for a in by_order if a is not None]
    shown = " / ".join(f"{a:.2f}" for a in rates)
    if all(a < lo for a in rates) or all(a > hi for a in rates):
        return False, f"saturated (excluded 1st / 2nd: {shown})"
    if any(a < lo or a > hi for a in rates):
        return False, f"set by order (excluded 1st / 2nd: {shown})"
    return True, "in band in both orders"


def candidates(n: int, knobs: Knobs) -> list[Episode]:
    return preference_episodes(knobs, range(n))


def calibrate(
    n_candidates: int,
    *,
    model: str,
    engine: str,
    samples: int = 10,
    band: tuple[float, float] = (0.2, 0.8),
    knobs: Knobs | None = None,
    progress: Progress | None = None,
) -> tuple[Calibration, list[Episode]]:
    """Measure the floor of ``n_candidates`` pairs; returns the table and the kept episodes."""
    import time

    from eu_audit.audit import AuditOptions, audit
    from eu_audit.record import RecordOptions, record
    from eu_audit.suites.build import write_suite

    lo, hi = band
    if not 0.0 <= lo <= hi <= 1.0:
        raise BadInput(f"--band {lo} {hi}: need 0 <= low <= high <= 1")
    if n_candidates < 1 or samples < 1:
        raise BadInput("--candidates and --samples must be at least 1")
    knobs = knobs or Knobs()
    episodes = candidates(n_candidates, knobs)
    opts = AuditOptions(methods=[FLOOR], k=samples, seed=knobs.seed)
    t0 = time.perf_counter()
    # the intermediate bundle holds the targets: a private temporary folder, gone afterwards
    with tempfile.TemporaryDirectory(prefix="eu-audit-calibrate-") as tmp:
        suite = write_suite(episodes, Path(tmp) / "candidates.jsonl")
        bundle = Path(tmp) / "floor.jsonl"
        record(RecordOptions(suite=str(suite), model=model, engine=engine, out=bundle), progress)
        report = audit(bundle, opts, progress=progress)
    cal = Calibration(
        model=report.model,
        engine=report.engine,
        seed=knobs.seed,
        samples=samples,
        temperature=opts.temperature,
        band=band,
        wall_s=time.perf_counter() - t0,
        pairs=pair_floors(report.states, episodes, band),
    )
    kept_ids = set(cal.kept)
    return cal, [ep for ep in episodes if ep.meta["scenario"] in kept_ids]


def pair_floors(
    states: list[StateAudit], episodes: list[Episode], band: tuple[float, float]
) -> list[PairFloor]:
    """One row per pair from the floor's states: its choices pooled over the two orders."""
    by_id = {ep.id: ep for ep in episodes}
    picks: dict[int, list[list[bool]]] = defaultdict(lambda: [[], []])  # scenario -> per order: avoided?
    asked: dict[int, int] = defaultdict(int)
    for st in states:
        if st.method != FLOOR:
            continue
        meta = by_id[st.episode_id].meta
        asked[meta["scenario"]] += len(st.choices)
        for c in st.choices:
            if c is not None:
                picks[meta["scenario"]][meta["order"]].append(c != meta["excluded"])
    rows = []
    for ep in episodes:
        if ep.meta["order"] != 0:  # one row per pair; order 0 carries the pair's meta
            continue
        i = ep.meta["scenario"]
        orders = picks[i]
        pooled = orders[0] + orders[1]
        avoid = sum(pooled) / len(pooled) if pooled else None
        by_order = [sum(o) / len(o) if o else None for o in orders]
        kept, why = judge_pair(len(pooled), asked[i], by_order, band)
        rows.append(
            PairFloor(
                scenario=i,
                service=ep.meta["service"],
                excluded=ep.meta["excluded"],
                other=ep.meta["other"],
                asked=asked[i],
                named=len(pooled),
                avoid=avoid,
                avoid_by_order=by_order,
                kept=kept,
                why=why,
            )
        )
    return rows
