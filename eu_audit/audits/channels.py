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

from eu_audit.audits.channel_kinds import CHANNEL_KINDS, VERDICTS, Verdict, channel_value
from eu_audit.audits.model import StateAudit

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
    k = CHANNEL_KINDS.get(kind)
    return k is not None and k.floor_comparable and (k.value(floor, tier) or 0) > 0


def control_holds(control: StateAudit, name: str) -> bool:
    """Whether the positive control (the no-forget tenant) of a session held z in the channel ``name``;
    for a recheck (``after.*``, which the control never runs) whether it kept z at all."""
    k = next((k for k in CHANNEL_KINDS.values() if name == k.label or name.startswith(f"{k.name}.")), None)
    if k is not None and not k.floor_comparable:
        kept = (
            channel_value(control, kind, t) or 0
            for kind in ("prompt", "store")
            for t in CHANNEL_KINDS[kind].tiers(control)
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

    tiers = {kind: k.all_tiers(states) for kind, k in CHANNEL_KINDS.items()}
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
            for row in k.rows(s, tiers[kind], leaked):
                add(s, *row)
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
