"""A metric is one object: its name, label, direction, binariness, paper table, JUnit membership, number
format and its computation (from a state's evidence, or against the floor's state) are declared once,
and the scoring, tables, JUnit, gates and the Markdown report all read them. The built-in metrics are
declared in ``eu_audit.audits.catalog``; ``metric(Metric(name=..., ...))`` adds one."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from eu_audit.registry import Registry, forwards_registration
from eu_audit.trace.records import Side  # re-exported: the audits' name for it

if TYPE_CHECKING:
    from eu_audit.audits.state_evidence import FloorPair, NotMeasured, StateEvidence

Direction = Literal["low", "high"]  # which way is better: "low" for leakage and divergence
Format = Literal["rate", "count", "seconds", "distance"]
#: what a failed rule against the floor on this metric says of a method, for the summary's groups: it
#: still says the target, it acts unlike B5 (probes, samples, actions, choices), it still holds the target
Shows = Literal["says", "behaves", "keeps"]
#: what the verdict may assume of its values, which picks its tests (``verdict.TESTS``): 0/1 outcomes, rates
#: in [0, 1], or unbounded values (counts, seconds, distances)
Kind = Literal["binary", "rate", "unbounded"]


@dataclass(frozen=True, kw_only=True)
class Metric:
    """Built with keywords only (``Metric(name=..., label=..., ...)``): a new field never shifts a plugin's
    arguments."""

    name: str
    label: str  # a short column label
    direction: Direction
    binary: bool  # a per-state 0/1 outcome, or a continuous one (``kind``)
    description: str
    table: int | None = None  # the paper's Table 1 (leakage), 2 (actions, utility, cost), 3 (behavior)
    junit: bool = False  # one JUnit case per method x suite
    report: bool = False  # a column of the Markdown report's per-suite table
    fmt: Format = "rate"
    #: its value from one state's evidence (None: computed elsewhere, e.g. Leak@probes over the run)
    compute: Callable[[StateEvidence], float | NotMeasured | None] | None = None
    #: its value from a state and the floor's state of the same session (CAD, agreement, distances)
    against_floor: Callable[[FloorPair], float | NotMeasured | None] | None = None
    #: the sides it is computed on: a white-box state, a black-box agent's run
    sides: frozenset[Side] = frozenset({"white", "black"})
    #: an observation of z in a place (a prompt after the forget, a store row): against the floor, one
    #: session where the method holds more of it than the floor's state is a failure at any n
    observation: bool = False
    #: the summary group a failed rule on it puts a method in (None: "fails another rule")
    shows: Shows | None = None
    #: a hold on it needs a positive control: the state without the forget (B0) must have shown what it
    #: measures (z said, done, kept; an action or answer unlike the reference) in some session, or the
    #: measurement could not tell a forget from none (``eu_audit.audits.verdict``: *insensitive*). Cost,
    #: utility and serving-cache metrics measure no z and need none
    control: bool = False
    #: a report column and a channel row only where some state of the audit measured it (or said why it
    #: could not): a reading most runs never take (eu-audit's read of an agent's files, a bystander), so a
    #: report of a run without it is as it was before it existed
    when_measured: bool = False
    #: what a rule on it evidences, for a signed receipt's controls ("this run measured X", never legal
    #: advice); empty: the receipt names no obligation for it
    receipt: tuple[str, ...] = ()
    #: the channel row (``eu_audit.audits.channels``) where a failed rule on it shows z: the place SARIF
    #: and the job summary point at for it ("": none)
    channel: str = ""
    #: shown beside each state's probes in the view: its value says whether z was measured in that state
    per_state: bool = False
    #: read from the post-forget state or serve's log, which an audit JSON does not keep: ``rescore``
    #: leaves it as the audit had it (and says so)
    from_state: bool = False

    def measured_in(self, states: Iterable[Any]) -> bool:
        """Whether any of ``states`` (``StateAudit``) carries this metric, measured or not measurable."""
        return any(self.name in s.values or self.name in s.unmeasured for s in states)

    @property
    def bounded(self) -> bool:
        """Its values lie in [0, 1] (a rate): the verdict's bound for it needs no distribution."""
        return self.fmt == "rate"

    @property
    def kind(self) -> Kind:
        """Its kind for the verdict's tests, read from what it declares and never from its data."""
        return "binary" if self.binary else "rate" if self.bounded else "unbounded"

    def format(self, value: float | None) -> str:
        if value is None:
            return "-"
        if self.fmt == "count" or abs(value) >= 100:
            return f"{value:.0f}"
        if self.fmt == "seconds":
            return f"{value:.1f}"
        return f"{value:.2f}"

    def at_floor(self, value: float, floor: float, margin: float) -> bool:
        """Within ``margin`` of the floor, or better than it."""
        return value <= floor + margin if self.direction == "low" else value >= floor - margin


METRICS: Registry[Metric] = Registry("metrics", builtins=("eu_audit.audits.catalog",))


@forwards_registration
def metric(m: Metric) -> Metric:
    METRICS.add(m.name, m)
    return m


#: the paper's table titles
TABLE_TITLES = {
    1: "Table 1 - leakage (rate of states that leak)",
    2: "Table 2 - actions, utility, cost",
    3: "Table 3 - behavior and distribution under sampling",
}


def table_metrics(table: int) -> list[Metric]:
    return [m for m in METRICS.in_order() if m.table == table]


def junit_metrics() -> list[Metric]:
    return [m for m in METRICS.in_order() if m.junit]


def report_metrics() -> list[Metric]:
    return [m for m in METRICS.in_order() if m.report]
