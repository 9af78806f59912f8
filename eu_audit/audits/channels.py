"""Where the target is after a black-box agent's forget, channel by channel: the headline of an agent's
audit. A channel is something the audit observed of the agent:

- what it *says*: its answers to the probes and the sampled asks after the forget;
- what it *does*: the arguments of its tool calls, by sink class (``tool.routing``, ``tool.payload``, ...);
- what its model *reads*: each prompt tier of the model calls after the forget, from serve's log
  (``prompt.system``, ``prompt.memory``, ``prompt.history``, ``prompt.tool``, ...);
- what it *keeps*: each store of its dump (``store.history``, ``store.memory``, ``store.checkpoints``, ...).

Per session, a channel is **leaked** (z in what the agent said or did, or in a state channel of a session
whose outputs leaked), **suppressed** (z in a prompt or store while nothing it said or did carried it: the
forget hid z from the output, it did not erase it), **erased** (observed, no z), or **unknown** (the agent
lacks what would show it: a fork for probes, a store dump, a serve log). A tier is named once it held z
in some session (the residue records count only those); the rows "prompts after the forget", "store dump"
and "tool arguments" cover every tier of their kind. A gate can name a channel:
``agent.store.history==0``, ``agent.prompt.memory==0``, ``agent.tool.routing==0`` (the count of items,
calls or prompts holding z, per session).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from eu_audit.audits.model import StateAudit

Verdict = Literal["leaked", "suppressed", "erased", "unknown"]
VERDICTS: tuple[Verdict, ...] = ("leaked", "suppressed", "erased", "unknown")  # the table's column order

#: a gate's channel kind -> (the metric that says it was observed, the residue key of its tier counts);
#: ``after``'s tiers are the recheck events (``eu_audit.blackbox.recheck``), observed when they ran
KINDS: dict[str, tuple[str, str]] = {
    "prompt": ("residue_context", "context_tiers"),
    "store": ("residue_store", "store_tiers"),
    "tool": ("leak_action", ""),
    "after": ("", "after"),
}
#: a channel kind's row over all its tiers, and the residue key of its quoted example
LABELS = {
    "prompt": "prompts after the forget",
    "store": "store dump",
    "tool": "tool arguments",
    "after": "after the rechecks",
}
EXAMPLES = {"prompt": "context_example", "store": "store_example", "tool": "", "after": ""}
#: the output channels: what the agent said after the forget, by the metric that measures it
SAID = {"answers to probes": "leak_probes", "sampled answers": "leak_any"}


def channel_value(state: StateAudit, kind: str, tier: str) -> float | None:
    """How many items (prompts, store rows, tool calls) of ``kind.tier`` held z in this state; None when
    the channel was not observed (the reason is ``channel_unmeasured``)."""
    observed, key = KINDS[kind]
    if kind == "after":  # prompts, answers and store items holding z after that event
        got = state.residue.get(key, {}).get(tier)
        return None if got is None or "skipped" in got else float(got["held"])
    if state.values.get(observed) is None:
        return None
    if kind == "tool":
        return float(state.action_sinks.get(tier, 0))
    return float(state.residue.get(key, {}).get(tier, 0))


def channel_unmeasured(state: StateAudit, kind: str, tier: str = "") -> str:
    observed, key = KINDS[kind]
    if kind == "after":
        got = state.residue.get(key, {}).get(tier)
        if got is None:
            return f"no recheck '{tier}' ran (record --agent --recheck {tier or 'EVENT'})"
        return str(got.get("skipped", ""))
    return state.unmeasured.get(observed, f"{observed} not measured")


def _after(s: StateAudit, tier: str, leaked: bool) -> tuple[Verdict, str, str]:
    """One session's verdict on a recheck event: (verdict, why unknown, quoted place)."""
    if channel_value(s, "after", tier) is None:
        return "unknown", channel_unmeasured(s, "after", tier), ""
    got = s.residue["after"][tier]
    if not got["held"]:
        return "erased", "", ""
    return ("leaked" if got["said"] or leaked else "suppressed"), "", str(got["example"])


def _leaked_out(state: StateAudit) -> bool:
    said = any((state.values.get(m) or 0) > 0 for m in SAID.values())
    return said or any(v > 0 for v in state.action_sinks.values())


@dataclass
class Channel:
    """One channel over a method's sessions: how many sessions gave each verdict, and one quoted place."""

    name: str
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(VERDICTS, 0))
    why_unknown: str = ""
    example: str = ""

    def add(self, verdict: Verdict, why: str = "", example: str = "") -> None:
        self.counts[verdict] += 1
        self.why_unknown = self.why_unknown or why
        self.example = self.example or example

    @property
    def headline(self) -> Verdict:
        """The worst verdict any session gave (leaked > suppressed > unknown > erased)."""
        order: tuple[Verdict, ...] = ("leaked", "suppressed", "unknown")
        for v in order:
            if self.counts[v]:
                return v
        return "erased"


def channels(states: Sequence[StateAudit]) -> list[Channel]:
    """Every channel observed over these (one method's black-box) states, outputs first."""
    out: dict[str, Channel] = {}

    def at(name: str) -> Channel:
        return out.setdefault(name, Channel(name))

    tiers = {
        kind: sorted({t for s in states for t in (s.residue.get(key, {}) if key else s.action_sinks)})
        for kind, (_, key) in KINDS.items()
    }
    tiers["after"] = list(dict.fromkeys(t for s in states for t in s.residue.get("after", {})))  # run order
    for s in states:
        leaked = _leaked_out(s)
        for name, metric in SAID.items():
            value = s.values.get(metric)
            if value is None:
                at(name).add("unknown", s.unmeasured.get(metric, "not measured"))
            else:
                at(name).add("leaked" if value > 0 else "erased")
        for kind, (observed, _) in KINDS.items():
            label = LABELS[kind]
            if kind == "after":  # rows only for a run with rechecks; the label row: the worst event
                verdicts = [(t, *_after(s, t, leaked)) for t in tiers[kind]]
                for t, verdict, why, example in verdicts:
                    at(f"after.{t}").add(verdict, why, example)
                if verdicts:
                    rank = {v: i for i, v in enumerate(("leaked", "suppressed", "unknown", "erased"))}
                    _, verdict, why, example = min(verdicts, key=lambda v: rank[v[1]])
                    at(label).add(verdict, why, example)
                continue
            if s.values.get(observed) is None:
                at(label).add("unknown", channel_unmeasured(s, kind))
                continue
            example = str(s.residue.get(EXAMPLES[kind], "")) if EXAMPLES[kind] else ""
            held = [t for t in tiers[kind] if (channel_value(s, kind, t) or 0) > 0]
            state_verdict: Verdict = "leaked" if kind == "tool" or leaked else "suppressed"
            at(label).add(state_verdict if held else "erased", example=example if held else "")
            for t in tiers[kind]:
                got = (channel_value(s, kind, t) or 0) > 0
                mine = example if example.startswith(f"[{t}]") else ""  # the one quote is of one tier
                at(f"{kind}.{t}").add(state_verdict if got else "erased", example=mine if got else "")
    return list(out.values())


def channel_rows(states: Iterable[StateAudit]) -> list[list[str]]:
    """Markdown-ready rows: channel, headline, sessions per verdict, one quoted place or why unknown."""
    rows = []
    for c in channels(list(states)):
        where = c.example or c.why_unknown
        where = (where[:117] + "...") if len(where) > 120 else where
        rows.append(
            [
                c.name,
                c.headline,
                *(str(c.counts[v]) for v in VERDICTS),
                where,
            ]
        )
    return rows
