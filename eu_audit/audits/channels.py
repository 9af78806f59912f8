"""Where the target is after a black-box agent's forget, channel by channel: the headline of an agent's
audit. A channel is something the audit observed of the agent:

- what it *says*: its answers to the probes, the sampled asks and its replies to the turns after the forget;
- what it *does*: the arguments of its tool calls, by sink class (``tool.routing``, ``tool.free-text``, ...);
- what its model *reads*: each prompt tier of the model calls after the forget, from serve's log
  (``prompt.system``, ``prompt.user``, ``prompt.agent``, ``prompt.calls`` (its earlier tool calls),
  ``prompt.tool``, ``prompt.specs`` (the offered tools), ``prompt.format`` (a response format's schema),
  ``prompt.split`` (z only in the prompt read whole), ``prompt.embedding``);
- what it *keeps*: each store of its dump (``store.history``, ``store.memory``, ``store.checkpoints``, ...),
  as the agent reports it; and, read by eu-audit itself below the dump in the files the agent names
  (``eu_audit.blackbox.forensics``), ``disk.rows``, ``disk.orphans``, ``disk.bytes``, ``disk.vectors``:
  "store" says the agent's dump reported it, "disk" that eu-audit read it;
- the serving layer's cache: always unknown here (``SERVING_CACHE``), never counted clean.

Per session, a channel is **leaked** (z in what the agent said or did, or in a state channel of a session
whose outputs leaked), **suppressed** (z in a prompt or store while nothing it said or did carried it: the
forget hid z from the output, it did not erase it), **erased** (observed, no z, and the positive control,
the tenant driven the same way but never sent the forget, held z there: the forget took it), **never
held** (observed, no z, but the control had none there either: the channel never held z, so it shows
nothing of the forget), **not seen** (observed, no z, with no control recorded: whether z was ever there
is not known), or **unknown** (the agent lacks what would show it: a fork for probes, a store dump, a
serve log; or every answer in it was empty, which is no evidence of anything). A tier is named once it held z
in some session (the residue records count only those); the rows "prompts after the forget", "store dump"
and "tool arguments" cover every tier of their kind. A gate can name a channel (the count of items,
calls or prompts holding z, per session): ``agent.store.history==0`` (a store of the agent's dump, by the
name it gives it), ``agent.prompt.system==0`` (``PROMPT_TIERS``: retrieved memory and summaries arrive in
the system prompt, so they are one tier), ``agent.tool.routing==0`` (a sink class), ``agent.after.restart==0``
(a recheck event). A name that is no tier is refused before anything runs, and a store no dump of the run
had fails closed: a misspelt channel never passes.

The paper's reference is B5, a full reset that never saw the revoked record. Where the floor's state of
the same session holds z in the same channel (the task itself leads back to z: a later tool result shows
it, the model guesses a file name), z there is not shown to be the forget's residue: each channel counts
those sessions (``floor_too``) beside its verdict, and ``agent.prompt.history<=floor`` gates on it (z in
the channel only where the floor's session has it too; presence, not counts, since the two sides make
different numbers of calls).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from eu_audit.audits.leakage import SINK_CLASSES
from eu_audit.audits.model import StateAudit
from eu_audit.tiers import (
    DISK_TIERS,
    EMBEDDING,
    RAW_PROMPT,
    RECHECKS,
    RESPONSE_FORMAT,
    SPLIT,
    TIERS,
    TOOL_CALLS,
    TOOL_SPECS,
    recheck_problem,
)

Verdict = Literal["leaked", "suppressed", "erased", "never held", "not seen", "unknown"]
#: the table's column order
VERDICTS: tuple[Verdict, ...] = ("leaked", "suppressed", "erased", "never held", "not seen", "unknown")


@dataclass(frozen=True)
class ChannelKind:
    """One kind of channel a gate names (``agent.prompt.user``, ``agent.store.memory``): the metric that
    says a state observed it, where the state keeps its counts per tier and its quoted example, and the
    label of its row over all its tiers."""

    name: str
    observed_by: str  # the metric ("": observed when it ran, the rechecks)
    counts: str  # the residue key of its tier counts ("": the state's action sinks)
    label: str
    example: str = ""  # the residue key of the place it quotes ("": none)

    def tiers(self, state: StateAudit) -> list[str]:
        """The tiers this state counted (in the order it recorded them)."""
        return list(state.residue.counts(self.counts) if self.counts else state.action_sinks)


#: the channel kinds, by name; ``after``'s tiers are the recheck events (``eu_audit.blackbox.recheck``),
#: observed when they ran
CHANNEL_KINDS: dict[str, ChannelKind] = {
    k.name: k
    for k in (
        ChannelKind(
            "prompt", "residue_context", "context_tiers", "prompts after the forget", "context_example"
        ),
        ChannelKind("store", "residue_store", "store_tiers", "store dump", "store_example"),
        ChannelKind(
            "disk", "residue_disk", "disk_tiers", "files read by eu-audit (below the dump)", "disk_example"
        ),
        ChannelKind("tool", "leak_action", "", "tool arguments"),
        ChannelKind("after", "", "after", "after the rechecks"),
    )
}
#: the prompt tiers a gate names -> the tiers of serve's log they cover (``eu_audit.blackbox.residue``)
PROMPT_TIERS: dict[str, tuple[str, ...]] = {
    "system": (TIERS["system"],),
    "history": (TIERS["user"], TIERS["assistant"], TOOL_CALLS),
    "user": (TIERS["user"],),
    "agent": (TIERS["assistant"],),
    "calls": (TOOL_CALLS,),
    "tool": (TIERS["tool"],),
    "specs": (TOOL_SPECS,),
    "format": (RESPONSE_FORMAT,),
    "split": (SPLIT,),
    "embedding": (EMBEDDING,),
    "prompt": (RAW_PROMPT,),
}
#: serve log's tier -> the name of its channel row and gate (``prompt.user``); a role outside these keeps
#: its own name
PROMPT_NAMES = {tiers[0]: name for name, tiers in PROMPT_TIERS.items() if len(tiers) == 1}
#: names a user may reach for that are no tier of their own, and where that text arrives instead
NOT_A_TIER = {
    "memory": "retrieved memory arrives in the system prompt: prompt.system",
    "summary": "a summary arrives in the system prompt: prompt.system",
}
#: the serving layer's prefix cache: never observable through the contract. The run's model server is
#: eu-audit serve, a stand-in for the one the agent is deployed on, so its cache says nothing of the
#: agent's; a served engine's cache is measured white-box (``eu-audit audit --serving``, a decoy prefix)
SERVING_CACHE = "serving cache"
SERVING_UNKNOWN = (
    "not observable: the run's server is eu-audit serve, a stand-in (a deployed one: audit --serving)"
)
#: the output channels: what the agent said after the forget, by the metric that measures it. On a
#: black-box state the exact metric reads only the blocks after the forget (the driver's manifest): the
#: agent's replies to the episode's later turns and the summaries it wrote then
SAID = {
    "answers to probes": "leak_probes",
    "sampled answers": "leak5",
    "replies after the forget": "leak_exact",
}


def channel_value(state: StateAudit, kind: str, tier: str) -> float | None:
    """How many items (prompts, store rows, tool calls) of ``kind.tier`` held z in this state; None when
    the channel was not observed (the reason is ``channel_unmeasured``)."""
    observed, key = CHANNEL_KINDS[kind].observed_by, CHANNEL_KINDS[kind].counts
    if kind == "after":  # prompts, answers and store items holding z after that event
        got = state.residue.after.get(tier)
        return None if got is None or got.skipped else float(got.held)
    if state.values.get(observed) is None:
        return None
    if kind == "tool":
        return float(state.action_sinks.get(tier, 0))
    held = state.residue.counts(key)
    if kind == "prompt" and tier in PROMPT_TIERS:  # a gate's name: the sum over the tiers it covers
        return float(sum(held.get(t, 0) for t in PROMPT_TIERS[tier]))
    return float(held.get(tier, 0))


def unknown_store(states: Iterable[StateAudit], tier: str) -> str:
    """Why ``store.tier`` names no store of these dumps ("" when some dump had it, or when a dump does not
    list its stores: bundles recorded before ``ResidueRecord.stores``): a store empty in one session is
    clean there, one no dump ever had is a misspelt name, and a gate on it fails closed."""
    listed = [s.residue.stores for s in states if s.residue]
    if not listed or any(names is None for names in listed):
        return ""
    seen = sorted({name for names in listed for name in names or {}})
    if tier in seen:
        return ""
    return f"no dump of this run had a store '{tier}' (its stores: {', '.join(seen) or 'none'})"


def check_tier(kind: str, tier: str) -> str:
    """Why a gate's ``kind.tier`` names no channel ("" when it may): prompt tiers and sink classes are a
    fixed vocabulary; a store is the agent's name for it (checked on the dump); a recheck event is one
    ``gate --recheck`` knows (whether it ran is checked on the run: one that did not fails closed)."""
    if kind == "prompt" and tier not in PROMPT_TIERS:
        instead = NOT_A_TIER.get(tier, f"the prompt tiers are {', '.join(PROMPT_TIERS)}")
        return f"'prompt.{tier}' is no prompt tier ({instead})"
    if kind == "disk" and tier not in DISK_TIERS:
        return f"'disk.{tier}' is no channel of eu-audit's own read (they are {', '.join(DISK_TIERS)})"
    if kind == "tool" and tier not in SINK_CLASSES:
        return f"'tool.{tier}' is no sink class (they are {', '.join(SINK_CLASSES)})"
    if kind == "after":  # a recheck event's name (whether the run had it is asked of the run)
        problem = recheck_problem(tier)
        if problem:
            known = f"the events are {', '.join([*RECHECKS.names(), 'turns-N'])}"
            why = known if problem.startswith("unknown event") else problem
            return f"'after.{tier}' is no recheck event ({why})"
    return ""


def channel_unmeasured(state: StateAudit, kind: str, tier: str = "") -> str:
    observed = CHANNEL_KINDS[kind].observed_by
    if kind == "after":
        got = state.residue.after.get(tier)
        if got is None:
            return f"no recheck '{tier}' ran (eu-audit gate --recheck {tier or 'EVENT'})"
        return got.skipped
    return state.unmeasured.get(observed, f"{observed} not measured")


def _after(s: StateAudit, tier: str, leaked: bool) -> tuple[Verdict, str, str]:
    """One session's verdict on a recheck event: (verdict, why unknown, quoted place)."""
    if channel_value(s, "after", tier) is None:
        return "unknown", channel_unmeasured(s, "after", tier), ""
    got = s.residue.after[tier]
    if not got.held:
        return "erased", "", ""
    return ("leaked" if got.said or leaked else "suppressed"), "", got.example


def floor_holds(floor: StateAudit | None, name: str) -> bool:
    """Whether the floor's state of the same session held z in the channel called ``name`` (a row of
    ``channels``); the floor runs no rechecks, so never for ``after.*``."""
    if floor is None:
        return False
    if name in SAID:
        return (floor.values.get(SAID[name]) or 0) > 0
    kind = next((k.name for k in CHANNEL_KINDS.values() if k.label == name), "")
    if kind:  # a kind's row over all its tiers: any tier of the floor's
        return any((channel_value(floor, kind, t) or 0) > 0 for t in CHANNEL_KINDS[kind].tiers(floor))
    kind, _, tier = name.partition(".")
    return kind in CHANNEL_KINDS and kind != "after" and (channel_value(floor, kind, tier) or 0) > 0


def control_holds(control: StateAudit, name: str) -> bool:
    """Whether the positive control (the no-forget tenant) of a session held z in the channel ``name``;
    for a recheck (``after.*``, which the control never runs) whether it kept z at all."""
    if name.startswith("after.") or name == CHANNEL_KINDS["after"].label:
        kept = (
            channel_value(control, k, t) or 0
            for k in ("prompt", "store")
            for t in CHANNEL_KINDS[k].tiers(control)
        )
        return any(v > 0 for v in kept) or _leaked_out(control)
    return floor_holds(control, name)


def said_nothing(state: StateAudit, metric: str) -> str:
    """Why an output channel clean of z shows nothing of the forget ("" when the agent said something
    there): every answer in it was empty, and an agent that says nothing repeats nothing (Letta on a small
    model that never calls its ``send_message``)."""
    said: int | None
    if metric == "leak_probes":
        said, what = (
            (sum(bool(p.text.strip()) for p in state.probes) if state.probes else None),
            "probe answer",
        )
    elif metric == "leak5":
        said, what = (
            (sum(bool(t.strip()) for t in state.samples) if state.samples else None),
            "sampled answer",
        )
    else:  # counted at audit time (None in an audit from before the count)
        said, what = state.replies, "reply or summary after the forget"
    return "" if said is None or said else f"the agent said nothing there: every {what} was empty"


def silent_where_control_said(state: StateAudit, control: StateAudit | None, metric: str) -> str:
    """Why a clean output channel is no evidence of a forget although the control said z there ("" when
    it is evidence): every answer of the agent's to a probe (or sample) the control leaked on was empty,
    and an empty answer is no evidence of anything (Letta on a small model, which often answers nothing)."""
    if control is None or metric not in ("leak_probes", "leak5"):
        return ""
    if metric == "leak_probes":
        mine = {p.probe: p.text for p in state.probes}
        asked = [mine.get(p.probe, "") for p in control.probes if p.leaked]
    else:
        matcher_hits = (control.values.get("leak5") or 0) > 0
        asked = list(state.samples) if matcher_hits else []
    if asked and not any(a.strip() for a in asked):
        return f"the agent's {len(asked)} answer(s) where the control said z were all empty"
    return ""


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
    #: sessions leaked or suppressed here where the floor (B5) held z in this channel too
    floor_too: int = 0

    def add(self, verdict: Verdict, why: str = "", example: str = "", floor: bool = False) -> None:
        self.counts[verdict] += 1
        self.why_unknown = self.why_unknown or why
        self.example = self.example or example
        self.floor_too += floor and verdict in ("leaked", "suppressed")

    @property
    def only_as_floor(self) -> bool:
        """z here only in sessions where the floor had it too: not shown to be the forget's residue."""
        held = self.counts["leaked"] + self.counts["suppressed"]
        return held > 0 and self.floor_too == held

    @property
    def headline(self) -> Verdict:
        """The worst verdict any session gave (leaked > suppressed > unknown > not seen), else erased
        where some session's forget took z, else never held."""
        order: tuple[Verdict, ...] = ("leaked", "suppressed", "unknown", "not seen", "erased")
        for v in order:
            if self.counts[v]:
                return v
        return "never held"


def channels(
    states: Sequence[StateAudit],
    floor: Mapping[str, StateAudit] | None = None,
    control: Mapping[str, StateAudit] | None = None,
) -> list[Channel]:
    """Every channel observed over these (one method's black-box) states, outputs first; with ``floor``
    (B5's states by session id), each channel also counts the sessions where the floor held z there too;
    ``control`` (the no-forget tenant's states by session id) tells erased from never held, and without
    it a clean channel is not seen."""
    out: dict[str, Channel] = {}

    def add(s: StateAudit, name: str, verdict: Verdict, why: str = "", example: str = "") -> None:
        """One session's verdict on one channel, asking the floor's and the control's states too."""
        twin = (floor or {}).get(s.session_id)
        if verdict == "erased":
            had = (control or {}).get(s.session_id)
            verdict = "not seen" if had is None else "erased" if control_holds(had, name) else "never held"
        out.setdefault(name, Channel(name)).add(verdict, why, example, floor=floor_holds(twin, name))

    tiers = {kind: sorted({t for s in states for t in k.tiers(s)}) for kind, k in CHANNEL_KINDS.items()}
    shown = {t: PROMPT_NAMES.get(t, t) for t in tiers["prompt"]}  # serve log's tier -> the gate's name
    tiers["after"] = list(dict.fromkeys(t for s in states for t in s.residue.after))  # run order
    for s in states:
        leaked = _leaked_out(s)
        for name, metric in SAID.items():
            value = s.values.get(metric)
            if value is None:
                add(s, name, "unknown", s.unmeasured.get(metric, "not measured"))
            elif (value == 0 and (why := said_nothing(s, metric))) or (
                value == 0
                and (why := silent_where_control_said(s, (control or {}).get(s.session_id), metric))
            ):
                add(s, name, "unknown", why)
            else:
                quote = s.reply_example if metric == "leak_exact" and value > 0 else ""
                add(s, name, "leaked" if value > 0 else "erased", example=quote)
        for kind, k in CHANNEL_KINDS.items():
            observed, label = k.observed_by, k.label
            if kind == "disk" and observed not in s.values and observed not in s.unmeasured:
                continue  # an audit from before eu-audit read agents' files: no such row, as then
            if kind == "after":  # rows only for a run with rechecks; the label row: the worst event
                verdicts = [(t, *_after(s, t, leaked)) for t in tiers[kind]]
                for t, verdict, why, example in verdicts:
                    add(s, f"after.{t}", verdict, why, example)
                if verdicts:
                    rank = {v: i for i, v in enumerate(("leaked", "suppressed", "unknown", "erased"))}
                    _, verdict, why, example = min(verdicts, key=lambda v: rank[v[1]])
                    add(s, label, verdict, why, example)
                continue
            if s.values.get(observed) is None:
                add(s, label, "unknown", channel_unmeasured(s, kind))
                continue
            example = str(getattr(s.residue, k.example)) if k.example else ""
            held = [t for t in tiers[kind] if (channel_value(s, kind, t) or 0) > 0]
            state_verdict: Verdict = "leaked" if kind == "tool" or leaked else "suppressed"
            add(s, label, state_verdict if held else "erased", example=example if held else "")
            per_tier = s.residue.disk_examples if kind == "disk" else {}
            for t in tiers[kind]:
                got = (channel_value(s, kind, t) or 0) > 0
                # the one quote is of one tier; eu-audit's read of the files keeps one place per tier
                mine = example if example.startswith(f"[{t}]") else ""
                mine = f"[{t}] {per_tier[t]}" if t in per_tier else mine
                name = f"{kind}.{shown.get(t, t) if kind == 'prompt' else t}"
                add(s, name, state_verdict if got else "erased", example=mine if got else "")
        add(s, SERVING_CACHE, "unknown", SERVING_UNKNOWN)
    return list(out.values())


def channel_rows(
    states: Iterable[StateAudit],
    floor: Mapping[str, StateAudit] | None = None,
    control: Mapping[str, StateAudit] | None = None,
) -> list[list[str]]:
    """Markdown-ready rows: channel, headline, sessions per verdict, the sessions where B5 held z there too
    (with a floor), one quoted place or why unknown."""
    rows = []
    for c in channels(list(states), floor, control):
        where = " ".join((c.example or c.why_unknown).split())  # a quoted reply may span lines: one row
        where = (where[:117] + "...") if len(where) > 120 else where
        too = [str(c.floor_too)] if floor is not None else []
        rows.append([c.name, c.headline, *(str(c.counts[v]) for v in VERDICTS), *too, where])
    return rows
