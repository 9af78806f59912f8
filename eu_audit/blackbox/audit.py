"""Auditing a black-box bundle (``eu-audit gate``): every figure comes from what the run kept (the
post-forget turns and actions, the elicitations, the residue records), so no model runs and the agent
is not needed. The evidence is scored by the white-box audit's own path (``audits.scoring``), and the
statistics, floor, tables, JSON, JUnit and gates are its own too."""

from __future__ import annotations

from eu_audit.audits.leakage import artifact_leak
from eu_audit.audits.metrics import picked
from eu_audit.audits.model import (
    BystanderOutcome,
    ProbeOutcome,
    RecheckOutcome,
    StateAudit,
    StateResidue,
    Tampering,
)
from eu_audit.audits.scoring import StateEvidence, score
from eu_audit.blackbox.facts import AgentRunFacts
from eu_audit.blackbox.recheck import at_forget
from eu_audit.blackbox.residue import snippet
from eu_audit.trace.records import AGENT_METHOD, ResidueRecord
from eu_audit.trace.session import Bundle, SessionTrace


def agent_state(trace: SessionTrace, caps: dict[str, object]) -> StateAudit:
    s = trace.session
    ep = s.episode
    st = StateAudit(
        session_id=s.parent_session or s.session_id,
        episode_id=ep.id,
        suite=s.suite,
        method=s.method or AGENT_METHOD,
    )
    m = trace.matcher()
    for e in trace.elicitations:
        if e.kind == "probe":
            st.probes.append(ProbeOutcome(probe=e.name, text=e.answer, leaked=m.found_in(e.answer)))
        elif e.kind == "sample":
            st.samples.append(e.answer)
            st.sample_seeds.append(e.seed or 0)
        elif e.kind == "choice":
            choice = next((x for x in ep.steps if x.choices), None)
            st.choices.append(picked(e.answer, choice.choices or []) if choice else None)
    art = artifact_leak(trace, ep.tau, m, resident_calls=True)
    st.action_sinks = {k: len(v) for k, v in art.action.items()}
    st.replies = art.said
    said = [trace.block(b) for b in art.exact if not b.startswith("memory:")]
    if said:  # the agent's own words after the forget (the audit JSON keeps z; reports mask it)
        st.reply_example = f"[turn {said[0].turn}, {said[0].type.value}] {snippet(said[0].text, m)}"
    # the rules read every check (a forget that comes back fails them); the channel rows of the prompts
    # and the dump are the checks right after the forget, and each recheck has a row of its own
    if trace.agent_forgets and trace.agent_forgets[0].changed is not None:
        st.forget_changed = trace.agent_forgets[0].changed
    residue = combined(trace.residues)
    score(st, StateEvidence("black", trace, m, art, st.probes, st.samples, st.choices, residue))
    if trace.residues:
        first = trace.residues[0]
        st.residue = StateResidue(
            context_tiers=first.context_tiers,
            context_example=first.context_example,
            store_tiers=first.store_tiers,
            store_example=first.store_example,
        )
        if first.stores is not None:  # None: no dump, or a bundle from before the field (names unknown)
            st.residue.stores = first.stores
        if first.bystander_lost is not None:
            st.residue.bystander = BystanderOutcome(
                records=first.bystander_records, lost=first.bystander_lost, example=first.bystander_example
            )
        if first.disk is not None:  # eu-audit's own read of the agent's files (``forensics``)
            st.residue.disk_tiers = first.disk
            # the most specific place first: a live row, an orphan, a vector, then raw bytes
            order = ("rows", "orphans", "vectors", "bytes")
            where = next(((k, first.disk_examples[k]) for k in order if k in first.disk_examples), None)
            st.residue.disk_example = f"[{where[0]}] {where[1]}" if where else ""
            st.residue.disk_examples = dict(first.disk_examples)  # one place per channel (disk.<tier>)
            st.residue.disk_unread = first.disk_unread
            st.residue.disk_undeclared = list(first.disk_undeclared)
        if len(trace.residues) > 1:
            # "came back": held after an event while no check right after the forget held it (the first
            # check, and the dump taken at once where --recheck at-once ran); never said of at-once itself
            early = [r for r in trace.residues[1:] if at_forget(r.after)]
            held_at_once = bool(first.context_calls_with_z or first.store_items_with_z) or any(
                r.store_items_with_z for r in early
            )
            st.residue.after = {
                r.after: recheck_summary(r, held_at_once or at_forget(r.after)) for r in trace.residues[1:]
            }
    return st


def combined(records: list[ResidueRecord]) -> ResidueRecord | None:
    """The counts the residue rules read, over the first check and every recheck (``--recheck``): z found
    after any event counts as z found, so a forget that comes back fails ``residue_context`` and
    ``residue_store``. Where z was stays per record (the channel rows)."""
    if not records:
        return None
    first, ran = records[0], [r for r in records if not r.skipped]

    def total(name: str) -> int | None:
        known = [getattr(r, name) for r in ran if getattr(r, name) is not None]
        return sum(known) if known and getattr(first, name) is not None else getattr(first, name)

    stored = [r.store_items_with_z for r in ran if r.store_items_with_z is not None]
    return first.model_copy(
        update={
            "context_calls": total("context_calls"),
            "context_calls_with_z": total("context_calls_with_z"),
            "store_items_with_z": max(stored) if stored and first.store_items is not None else None,
        }
    )


def recheck_summary(r: ResidueRecord, held_at_once: bool) -> RecheckOutcome:
    """What one recheck found, for the audit JSON and the channel ``after.<event>``: items holding z in
    the event's prompts, answers and dump (None: not observed), whether z *came back* (held after the
    event, in no prompt or dump item right after the forget), one quoted place, or why it did not run."""
    if r.skipped:
        return RecheckOutcome(skipped=r.skipped)
    answer = f"[answer] {r.reply_example}" if r.reply_example else ""
    found = {
        "prompts": r.context_calls_with_z,
        "answers": r.replies_with_z,
        "store": r.store_items_with_z,
    }
    held = sum(v for v in found.values() if v is not None)
    return RecheckOutcome(
        prompts=found["prompts"],
        answers=found["answers"],
        store=found["store"],
        of={"prompts": r.context_calls, "answers": r.replies, "store": r.store_items},
        held=held,
        back=bool(held) and not held_at_once,
        said=bool(r.replies_with_z),
        example=next((e for e in (answer, r.context_example, r.store_example) if e), ""),
    )


def agent_states(bundle: Bundle) -> tuple[list[StateAudit], int, float]:
    """Every session's audit from what the black-box run recorded (no model runs), with the k and the
    sampling temperature the run used."""
    facts = AgentRunFacts.of(bundle.header.engine_facts, str(bundle.path or ""))
    states = [agent_state(t, facts.capabilities.model_dump()) for t in bundle.sessions]
    for st in states:  # which key marked the requests counted as post-forget (serve_api)
        if st.residue:
            st.residue.control_key = facts.serve_control_key
    return states, facts.k, facts.temperature


def tampering(bundle: Bundle) -> list[Tampering]:
    """Every tamper attempt the run recorded, per session and tenant (``eu_audit.blackbox.tamper``)."""
    out = []
    for trace in bundle.sessions:
        first = trace.residues[0] if trace.residues else None
        for kind, count in sorted((first.tamper if first else {}).items()):
            out.append(
                Tampering(
                    session_id=trace.session.parent_session or trace.session_id,
                    tenant=trace.session.method or AGENT_METHOD,
                    kind=kind,
                    count=count,
                    example=snippet_masked(first.tamper_examples.get(kind, "") if first else "", trace),
                )
            )
    return out


def snippet_masked(text: str, trace: SessionTrace) -> str:
    """An example as the audit keeps it: z masked (a report is read by more people than the bundle)."""
    return trace.matcher().redact(text, "[z]")
