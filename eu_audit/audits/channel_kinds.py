"""The kinds of channel a black-box audit reads, each an object with its own behaviour: which tiers a state
counted, a tier's count on a state, why a state has none, which names are tiers of it (a gate's
``agent.KIND.TIER`` is checked by its kind before anything runs), and one session's verdict on the kind's
row and on each tier's. ``eu_audit.audits.channels`` builds the channel table from them; the rules
(``audits.rules``, ``audits.verdict``) read a channel's value through them. A kind is named once, here.

- ``prompt``: what the agent's model read after the forget, by tier of serve's log (``PROMPT_TIERS``);
- ``store``: each store of the agent's own dump, by the name it gives it (checked on the dump);
- ``disk``: eu-audit's own read of the files the agent names (``DISK_TIERS``);
- ``tool``: the arguments of its tool calls, by sink class (z there is said, whatever else held it);
- ``after``: each recheck event (``gate --recheck``), in run order; the floor runs none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from eu_audit.audits.leakage import SINK_CLASSES
from eu_audit.audits.model import StateAudit
from eu_audit.tiers import (
    DISK_TIERS,
    PROMPT_TIER_LABELS,
    RECHECKS,
    TOOL_CALLS,
    recheck_problem,
    tier_label,
)

Verdict = Literal["leaked", "suppressed", "erased", "never held", "not seen", "unknown"]
#: the table's column order
VERDICTS: tuple[Verdict, ...] = ("leaked", "suppressed", "erased", "never held", "not seen", "unknown")
#: one session's verdict on one row: (row name, verdict, why unknown, the quoted place)
ChannelRow = tuple[str, Verdict, str, str]

#: the prompt tiers a gate names -> the tiers of serve's log they cover (``eu_audit.tiers``): each tier
#: by its own id, and ``history``, the three a chat history holds
PROMPT_TIERS: dict[str, tuple[str, ...]] = {
    "system": ("system",),
    "history": ("user", "agent", TOOL_CALLS),
    **{tier: (tier,) for tier in PROMPT_TIER_LABELS if tier != "system"},
}
#: names a user may reach for that are no tier of their own, and where that text arrives instead
NOT_A_TIER = {
    "memory": "retrieved memory arrives in the system prompt: prompt.system",
    "summary": "a summary arrives in the system prompt: prompt.system",
}


@dataclass(frozen=True)
class ChannelKind:
    """One kind of channel a gate names (``agent.store.memory``): the metric that says a state observed
    it, where the state keeps its counts per tier and its quoted example, the label of its row over all
    its tiers. This base reads a kind whose tiers are any name the agent's dump gives (``store``)."""

    name: str
    observed_by: str  # the metric ("": observed when it ran, the rechecks)
    counts: str  # the residue key of its tier counts ("": the state's action sinks)
    label: str
    example: str = ""  # the residue key of the place it quotes ("": none)
    #: whether a rule may hold it to the floor's state of the same session (the floor runs no rechecks)
    floor_comparable: bool = True

    def tiers(self, state: StateAudit) -> list[str]:
        """The tiers this state counted (in the order it recorded them)."""
        return list(state.residue.counts(self.counts))

    def all_tiers(self, states: Iterable[StateAudit]) -> list[str]:
        """The tiers any of these states counted: one row each."""
        return sorted({t for s in states for t in self.tiers(s)})

    def problem(self, tier: str) -> str:
        """Why ``KIND.TIER`` names no channel ("" when it may); a store's name is checked on the dump."""
        return ""

    def value(self, state: StateAudit, tier: str) -> float | None:
        """How many items of this tier held z in the state; None when it was not observed."""
        if state.values.get(self.observed_by) is None:
            return None
        return float(state.residue.counts(self.counts).get(tier, 0))

    def unmeasured(self, state: StateAudit, tier: str = "") -> str:
        return state.unmeasured.get(self.observed_by, f"{self.observed_by} not measured")

    def row_name(self, tier: str) -> str:
        return f"{self.name}.{tier}"

    def tier_label(self, tier: str) -> str:
        """The words a quoted example of this tier opens with (``[rows] ...``)."""
        return tier

    def places(self, state: StateAudit) -> dict[str, str]:
        """One quoted place per tier, where the state keeps one (else its one quote serves its tier)."""
        return {}

    def recorded(self, state: StateAudit) -> bool:
        """Whether this state's audit has this kind at all (an older audit may not)."""
        return True

    def held_verdict(self, leaked: bool) -> Verdict:
        """z held here: said, where the session's outputs leaked; suppressed where they did not."""
        return "leaked" if leaked else "suppressed"

    def rows(self, s: StateAudit, tiers: list[str], leaked: bool) -> list[ChannelRow]:
        """One state's verdict on this kind's row and on each of its tiers' (``tiers``: the run's)."""
        if not self.recorded(s):
            return []
        if s.values.get(self.observed_by) is None:
            return [(self.label, "unknown", self.unmeasured(s), "")]
        example = str(getattr(s.residue, self.example)) if self.example else ""
        held = {t for t in tiers if (self.value(s, t) or 0) > 0}
        verdict = self.held_verdict(leaked)
        out: list[ChannelRow] = [(self.label, verdict if held else "erased", "", example if held else "")]
        per_tier = self.places(s)
        for t in tiers:
            # the one quote is of one tier; eu-audit's read of the files keeps one place per tier
            opening = f"[{self.tier_label(t)}]"
            mine = f"[{t}] {per_tier[t]}" if t in per_tier else example if example.startswith(opening) else ""
            out.append((self.row_name(t), verdict if t in held else "erased", "", mine if t in held else ""))
        return out


@dataclass(frozen=True)
class PromptKind(ChannelKind):
    """The prompts after the forget: a gate's tier may cover several of serve's log (``prompt.history``)."""

    def problem(self, tier: str) -> str:
        if tier in PROMPT_TIERS:
            return ""
        instead = NOT_A_TIER.get(tier, f"the prompt tiers are {', '.join(PROMPT_TIERS)}")
        return f"'prompt.{tier}' is no prompt tier ({instead})"

    def value(self, state: StateAudit, tier: str) -> float | None:
        if tier not in PROMPT_TIERS:  # one of serve's log's own tiers, as the state counted it
            return super().value(state, tier)
        if state.values.get(self.observed_by) is None:
            return None
        held = state.residue.counts(self.counts)
        return float(sum(held.get(t, 0) for t in PROMPT_TIERS[tier]))  # the sum over the tiers it covers

    def tier_label(self, tier: str) -> str:
        return tier_label(tier)

    def all_tiers(self, states: Iterable[StateAudit]) -> list[str]:
        # in the order of their words, as the rows read (and as audits keyed by the words were shown)
        return sorted({t for s in states for t in self.tiers(s)}, key=tier_label)


@dataclass(frozen=True)
class DiskKind(ChannelKind):
    """eu-audit's own read of the agent's files: a fixed set of tiers, one quoted place each."""

    def problem(self, tier: str) -> str:
        if tier in DISK_TIERS:
            return ""
        return f"'disk.{tier}' is no channel of eu-audit's own read (they are {', '.join(DISK_TIERS)})"

    def places(self, state: StateAudit) -> dict[str, str]:
        return dict(state.residue.disk_examples)

    def recorded(self, state: StateAudit) -> bool:
        # an audit from before eu-audit read agents' files has no such row, as then
        return self.observed_by in state.values or self.observed_by in state.unmeasured


@dataclass(frozen=True)
class ToolKind(ChannelKind):
    """The arguments of the agent's tool calls, by sink class: z there is said, whatever else held it."""

    def tiers(self, state: StateAudit) -> list[str]:
        return list(state.action_sinks)

    def problem(self, tier: str) -> str:
        return (
            ""
            if tier in SINK_CLASSES
            else f"'tool.{tier}' is no sink class (they are {', '.join(SINK_CLASSES)})"
        )

    def value(self, state: StateAudit, tier: str) -> float | None:
        if state.values.get(self.observed_by) is None:
            return None
        return float(state.action_sinks.get(tier, 0))

    def held_verdict(self, leaked: bool) -> Verdict:
        return "leaked"


@dataclass(frozen=True)
class AfterKind(ChannelKind):
    """The recheck events (``eu_audit.blackbox.recheck``), observed when they ran: prompts, answers and
    store items holding z after each. Rows only for a run with rechecks; the label row is the worst."""

    def tiers(self, state: StateAudit) -> list[str]:
        return list(state.residue.after)

    def all_tiers(self, states: Iterable[StateAudit]) -> list[str]:
        return list(dict.fromkeys(t for s in states for t in self.tiers(s)))  # run order

    def problem(self, tier: str) -> str:
        problem = recheck_problem(tier)  # whether the run had it is asked of the run: absent fails closed
        if not problem:
            return ""
        if problem.startswith("unknown event"):
            problem = f"the events are {', '.join([*RECHECKS.names(), 'turns-N'])}"
        return f"'after.{tier}' is no recheck event ({problem})"

    def value(self, state: StateAudit, tier: str) -> float | None:
        got = state.residue.after.get(tier)
        return None if got is None or got.skipped else float(got.held)

    def unmeasured(self, state: StateAudit, tier: str = "") -> str:
        got = state.residue.after.get(tier)
        if got is None:
            return f"no recheck '{tier}' ran (eu-audit gate --recheck {tier or 'EVENT'})"
        return got.skipped

    def rows(self, s: StateAudit, tiers: list[str], leaked: bool) -> list[ChannelRow]:
        out: list[ChannelRow] = []
        for t in tiers:
            got = s.residue.after.get(t)
            if self.value(s, t) is None or got is None:
                out.append((self.row_name(t), "unknown", self.unmeasured(s, t), ""))
            elif not got.held:
                out.append((self.row_name(t), "erased", "", ""))
            else:
                out.append(
                    (self.row_name(t), "leaked" if got.said or leaked else "suppressed", "", got.example)
                )
        if out:
            rank = {v: i for i, v in enumerate(("leaked", "suppressed", "unknown", "erased"))}
            _, verdict, why, example = min(out, key=lambda r: rank[r[1]])
            out.append((self.label, verdict, why, example))
        return out


#: the channel kinds, by name (a gate's ``agent.KIND.TIER``)
CHANNEL_KINDS: dict[str, ChannelKind] = {
    k.name: k
    for k in (
        PromptKind(
            "prompt", "residue_context", "context_tiers", "prompts after the forget", "context_example"
        ),
        ChannelKind("store", "residue_store", "store_tiers", "store dump", "store_example"),
        DiskKind(
            "disk", "residue_disk", "disk_tiers", "files read by eu-audit (below the dump)", "disk_example"
        ),
        ToolKind("tool", "leak_action", "", "tool arguments"),
        AfterKind("after", "", "after", "after the rechecks", floor_comparable=False),
    )
}


def check_tier(kind: str, tier: str) -> str:
    """Why a gate's ``kind.tier`` names no channel ("" when it may)."""
    return CHANNEL_KINDS[kind].problem(tier)


def channel_value(state: StateAudit, kind: str, tier: str) -> float | None:
    """How many items (prompts, store rows, tool calls) of ``kind.tier`` held z in this state; None when
    the channel was not observed (the reason is ``channel_unmeasured``)."""
    return CHANNEL_KINDS[kind].value(state, tier)


def channel_unmeasured(state: StateAudit, kind: str, tier: str = "") -> str:
    return CHANNEL_KINDS[kind].unmeasured(state, tier)
