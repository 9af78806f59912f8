"""Auditing a black-box bundle (``record --agent``): every figure comes from what the run kept (the
post-forget turns and actions, the elicitations, the residue records), so no model runs and the agent
is not needed. The evidence is scored by the white-box audit's own path (``audits.scoring``), and the
statistics, floor, tables, JSON, JUnit and gates are its own too."""

from __future__ import annotations

from eu_audit.audits.leakage import artifact_leak
from eu_audit.audits.metrics import picked
from eu_audit.audits.model import ProbeOutcome, StateAudit
from eu_audit.audits.scoring import Evidence, score
from eu_audit.blackbox.facts import AgentRunFacts
from eu_audit.trace.session import Bundle, SessionTrace


def agent_state(trace: SessionTrace, caps: dict[str, object]) -> StateAudit:
    s = trace.session
    ep = s.episode
    st = StateAudit(
        session_id=s.parent_session or s.session_id,
        episode_id=ep.id,
        suite=s.suite,
        method=s.method or "agent",
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
    art = artifact_leak(trace, ep.tau, m)
    st.action_sinks = {k: len(v) for k, v in art.action.items()}
    residue = trace.residues[0] if trace.residues else None
    score(st, Evidence("black", trace, m, art, st.probes, st.samples, st.choices, residue))
    if residue is not None:
        st.residue = {
            "context_tiers": residue.context_tiers,
            "context_example": residue.context_example,
            "store_tiers": residue.store_tiers,
            "store_example": residue.store_example,
        }
    return st


def agent_states(bundle: Bundle) -> tuple[list[StateAudit], int, float]:
    """Every session's audit from what the black-box run recorded (no model runs), with the k and the
    sampling temperature the run used."""
    facts = AgentRunFacts.of(bundle.header.engine_facts, str(bundle.path or ""))
    states = [agent_state(t, facts.capabilities.model_dump()) for t in bundle.sessions]
    for st in states:  # which key marked the requests counted as post-forget (serve_api)
        if st.residue:
            st.residue["control_key"] = facts.serve_control_key
    return states, facts.k, facts.temperature
