"""A verdict per channel, the headline of a black-box audit: what the agent says and does after its
forget, what its model reads and what it keeps, each leaked, suppressed, erased or unknown, and a gate can
name one channel. Mechanics on scripted in-process agents (no model, seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eu_audit.audit import AuditOptions, audit
from eu_audit.audits.channels import channels
from eu_audit.audits.gate import evaluate
from eu_audit.audits.leakage import artifact_leak
from eu_audit.audits.model import FLOOR, AuditReport
from eu_audit.audits.output import channel_lines, channel_table
from eu_audit.blackbox.contract import StoreDump
from eu_audit.blackbox.drive import AgentRecordOptions, record_agent
from eu_audit.blackbox.residue import store_residue
from eu_audit.bundle.io import read_bundle
from eu_audit.matching import TargetMatcher
from eu_audit.trace.records import ToolCallRecord

from .helpers import run_cli


def run(tmp_path: Path, agent: str) -> tuple[Path, AuditReport]:
    out = tmp_path / f"{agent}.jsonl"
    record_agent(AgentRecordOptions(agent=f"tests.scripted_agents:{agent}", suite="builtin", n=2, out=out))
    return out, audit(out, AuditOptions())


@pytest.fixture(scope="module")
def hiding(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, AuditReport]:
    """One recorded run of the agent that hides z, shared by the module's tests (each takes a deep copy of
    the audit, so none sees another's changes)."""
    return run(tmp_path_factory.mktemp("hiding"), "hiding")


def hidden(recorded: tuple[Path, AuditReport]) -> tuple[Path, AuditReport]:
    bundle, rep = recorded
    return bundle, rep.model_copy(deep=True)


def by_name(rep: AuditReport) -> dict[str, dict[str, int]]:
    """Each channel's sessions per verdict, read against the run's no-forget tenant (the control)."""
    control = {s.session_id: s for s in rep.states if s.method == "b0"}
    return {
        c.name: c.counts for c in channels([s for s in rep.states if s.method == "agent"], control=control)
    }


def test_a_forget_that_only_stops_saying_z_is_suppressed_in_the_store_that_keeps_it(
    hiding: tuple[Path, AuditReport],
) -> None:
    _, rep = hidden(hiding)
    got = by_name(rep)
    assert got["answers to probes"]["erased"] == 2
    # the samples after the forget are read by Leak@k, which needs serve to pin their seeds: unknown here
    # (the replies to the episode's own turns after the forget are a row of their own, below)
    assert got["sampled answers"]["unknown"] == 2
    # its replies to the turns after the forget never carried z
    assert got["replies after the forget"]["erased"] == 2
    assert got["store.archive"]["suppressed"] == got["store dump"]["suppressed"] == 2
    assert "store.notes" not in got  # a store is named once it held z (the dump's other stores: "store dump")
    # no serve log: what reached the model is not observable, never counted clean
    assert got["prompts after the forget"]["unknown"] == 2
    # the serving layer's cache is never seen through the contract (serve is a stand-in): unknown, not clean
    assert got["serving cache"]["unknown"] == 2 and sum(got["serving cache"].values()) == 2
    assert any("store.archive suppressed (2 of 2 sessions)" in line for line in channel_lines(rep))
    table = "\n".join(channel_table(rep))
    assert "| store.archive | suppressed | 0 | 2 | 0 | 0 | 0 | 0 | 0 |" in table


def test_a_forget_that_deletes_nothing_leaks_in_its_answers_its_replies_and_its_store(tmp_path: Path) -> None:
    _, rep = run(tmp_path, "naive")
    got = by_name(rep)
    assert got["answers to probes"]["leaked"] == 2 and got["store.notes"]["leaked"] == 2
    # what it said to the episode's own turns after the forget is a channel too, quoted by turn
    agent = [s for s in rep.states if s.method == "agent"]
    replies = {c.name: c for c in channels(agent)}["replies after the forget"]
    assert replies.counts["leaked"] == 2 and replies.example.startswith("[turn ")
    assert all(s.values["leak_exact"] == 1 for s in agent)
    assert "| replies after the forget | leaked | 2 | 0 | 0 | 0 | 0 | 0 | 0 |" in "\n".join(
        channel_table(rep)
    )
    # a reply that spans lines, fences code and pipes text stays one row of the table, one code span
    for s in agent:
        s.reply_example = "[turn 9, assistant] Here:\n```bash\nsort | uniq\n```"
    row = next(line for line in channel_table(rep) if line.startswith("| replies after the forget |"))
    assert row.endswith("`[turn 9, assistant] Here: '''bash sort \\| uniq '''` |"), row


def test_an_agent_that_says_nothing_is_not_shown_to_have_erased_z_from_what_it_says(tmp_path: Path) -> None:
    _, rep = run(tmp_path, "mute")
    got = by_name(rep)
    assert got["answers to probes"]["unknown"] == got["replies after the forget"]["unknown"] == 2
    assert got["store dump"]["erased"] == 2  # what it keeps is observed all the same: its forget removed z
    table = "\n".join(channel_table(rep))
    assert (
        "| replies after the forget | unknown | 0 | 0 | 0 | 0 | 0 | 2 | 0 | `the agent said nothing there"
        in table
    )
    assert all(s.replies == 0 for s in rep.states if s.method == "agent")


def test_a_call_made_before_the_forget_is_not_something_the_agent_did_after_it(tmp_path: Path) -> None:
    bundle, _ = run(tmp_path, "naive")
    trace = next(t for t in read_bundle(bundle).sessions if t.session.method == "agent")
    tau, after = trace.session.episode.tau, trace.session.final_manifest
    before = next(b for b in trace.blocks if b.turn >= tau and b.id not in after)
    z = trace.session.target.value

    def call(block: str) -> ToolCallRecord:
        return ToolCallRecord(
            session_id=trace.session_id, call_id=f"c-{block}", turn=tau, name="send_email", raw="",
            arguments={"to": z}, consequential=True, committed=True, status="executed", block_id=block,
        )  # fmt: skip

    trace.tool_calls = [call(before.id)]
    # a black-box state's resident blocks are those after the forget; the white-box reading keeps every call
    assert not artifact_leak(trace, tau, resident_calls=True).action
    assert artifact_leak(trace, tau).action
    trace.tool_calls = [call(after[-1])]
    assert artifact_leak(trace, tau, resident_calls=True).action


def test_a_gate_can_name_one_channel_and_an_unobservable_one_fails_closed(
    hiding: tuple[Path, AuditReport], tmp_path: Path
) -> None:
    bundle, rep = hidden(hiding)
    rules = ["agent.store.archive==0", "agent.store.notes==0", "agent.prompt.system==0"]
    got = {g.rule: (g.outcome, g.detail) for g in evaluate(rep, rules)}
    assert got["agent.store.archive==0"][0] == "failed" and "2 of 2" in got["agent.store.archive==0"][1]
    assert got["agent.store.notes==0"][0] == "held"
    assert got["agent.prompt.system==0"][0] == "failed" and "never a pass" in got["agent.prompt.system==0"][1]
    proc = run_cli(
        "audit", str(bundle), "--gate", "agent.store.archive==0", "--json", str(tmp_path / "a.json")
    )
    assert proc.returncode == 1 and "agent.store.archive==0: FAILED" in proc.stdout
    bad = run_cli("audit", str(bundle), "--gate", "agent.store.archive>=floor")
    assert bad.returncode == 2 and "compared as '<=floor'" in bad.stderr


def test_a_misspelt_channel_never_passes(hiding: tuple[Path, AuditReport]) -> None:
    bundle, rep = hidden(hiding)
    # prompt tiers and sink classes are a fixed vocabulary: refused before anything runs
    for rule, says in [
        ("agent.prompt.memory==0", "arrives in the system prompt: prompt.system"),
        ("agent.prompt.histroy==0", "the prompt tiers are system, history"),
        ("agent.tool.payload==0", "they are routing, selection, free-text"),
        (
            "agent.after.restrat==0",
            "'after.restrat' is no recheck event "
            "(the events are at-once, compact, reindex, restart, turns-N)",
        ),
    ]:
        proc = run_cli("audit", str(bundle), "--gate", rule)
        assert proc.returncode == 2 and says in proc.stderr, (rule, proc.stderr)
    # a store is the agent's own name for it: one its dump never had fails closed, naming the ones it has
    got = {g.rule: g for g in evaluate(rep, ["agent.store.archve==0"])}["agent.store.archve==0"]
    assert got.outcome == "failed" and "no dump of this run had a store 'archve' (its stores: " in got.detail
    assert "archive" in got.detail
    # an empty dump lists no store (not "unknown"): a gate naming one still fails closed
    m = TargetMatcher.of("DE89 3704 0044 0532 0130 00")
    assert store_residue("s", StoreDump(items=[]), m).stores == {}
    assert store_residue("s", None, m).stores is None  # no dump: which stores it has is unknown
    for s in rep.states:
        s.residue.stores, s.residue.store_tiers = {}, {}
    got = {g.rule: g for g in evaluate(rep, ["agent.store.archive==0"])}["agent.store.archive==0"]
    assert got.outcome == "failed" and "(its stores: none)" in got.detail


def test_z_the_floor_also_holds_is_counted_beside_the_verdict_and_a_floor_gate_reads_it(
    hiding: tuple[Path, AuditReport],
) -> None:
    _, rep = hidden(hiding)
    rule = "agent.store.archive<=floor"
    # B5 never held z in the archive: the agent's copy is the forget's residue
    got = {g.rule: g for g in evaluate(rep, [rule])}[rule]
    assert got.outcome == "failed" and "where the floor's session had none in 2 of 2" in got.detail
    assert "| store.archive | suppressed | 0 | 2 | 0 | 0 | 0 |" in "\n".join(channel_table(rep))
    # the same run where B5's state had z in the same store in every session (a task that leads back to z)
    agent = {s.session_id: s for s in rep.states if s.method == "agent"}
    for s in rep.states:
        if s.method == FLOOR:
            s.residue = agent[s.session_id].residue.model_copy(deep=True)
            s.values["residue_store"] = agent[s.session_id].values["residue_store"]
    got = {g.rule: g for g in evaluate(rep, [rule])}[rule]
    # z there only where the floor had it: nothing the forget left; and since the reference holds z there
    # too, the no-forget control is no worse than it either: the rule cannot tell a forget from none
    assert got.outcome == "insensitive" and "only where the floor had it" in got.detail
    assert "| store.archive | suppressed | 0 | 2 | 0 | 0 | 0 | 0 | 2 |" in "\n".join(channel_table(rep))
    assert any("store.archive suppressed (2 of 2 sessions; B5 too)" in line for line in channel_lines(rep))
    # the count rule is still a fact: z in the store fails it, whatever B5 held
    assert evaluate(rep, ["agent.store.archive==0"])[0].outcome == "failed"


def test_erased_only_where_the_control_held_z_never_held_where_it_did_not_and_empty_answers_are_unknown() -> (
    None
):
    """A channel clean of z after the forget is *erased* only where the no-forget tenant (the positive
    control) had z there; *never held* where it had none; *not seen* with no control at all; and an
    output channel whose answers were empty where the control said z is *unknown*."""
    from eu_audit.audits.model import ProbeOutcome, StateAudit

    def state(method: str, store_z: int, probes: list[tuple[str, str, bool]]) -> StateAudit:
        return StateAudit(
            session_id="s0",
            episode_id="e",
            suite="builtin",
            method=method,
            probes=[ProbeOutcome(probe=p, text=t, leaked=leaked) for p, t, leaked in probes],
            values={"residue_store": float(bool(store_z)), "leak_probes": float(any(x[2] for x in probes))},
            residue={"store_tiers": {"memory": store_z} if store_z else {}, "stores": {"memory": 3}},
        )

    agent = state("agent", 0, [("direct", "", False), ("task", "I do not know.", False)])
    said_z = state("b0", 2, [("direct", "It is z.", True), ("task", "No idea.", False)])
    kept_nothing = state("b0", 0, [("task", "It is z.", True)])

    def verdicts(control: StateAudit | None) -> dict[str, str]:
        got = channels([agent], control={"s0": control} if control else None)
        return {c.name: c.headline for c in got}

    with_z = verdicts(said_z)
    assert with_z["store dump"] == "erased"  # the control kept z in its store: the forget took it
    # the control said z to the direct probe, and the agent's answer to it was empty: no evidence
    assert with_z["answers to probes"] == "unknown"
    without_z = verdicts(kept_nothing)
    assert without_z["store dump"] == "never held"  # nothing to erase: it shows nothing of the forget
    assert without_z["answers to probes"] == "erased"  # the control said z to 'task'; the agent did not
    assert verdicts(None)["store dump"] == "not seen"  # no control recorded
