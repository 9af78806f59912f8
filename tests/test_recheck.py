"""Forgets that come back: after the forget, ``record --agent --recheck`` runs a restart, a compaction
or more turns and checks again. A forget that passes at once and fails after a restart is a failed forget,
and the audit says after which event z came back and from where. Mechanics on scripted in-process agents
(no model, seconds); the serve-log side on logged entries."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eu_audit.audit import AuditOptions, audit
from eu_audit.audits.channels import channels
from eu_audit.audits.gate import evaluate
from eu_audit.audits.model import AuditReport
from eu_audit.audits.output import residue_lines
from eu_audit.blackbox.drive import AgentRecordOptions, record_agent
from eu_audit.blackbox.recheck import parse_rechecks
from eu_audit.blackbox.residue import context_residue
from eu_audit.bundle.io import read_bundle
from eu_audit.errors import BadInput
from eu_audit.serve.api import LogEntry
from eu_audit.trace.records import ResidueRecord

from .helpers import logged, run_cli

RECHECK = ("restart", "compact", "turns-2")


def run(tmp_path: Path, agent: str, recheck: tuple[str, ...] = RECHECK) -> tuple[Path, AuditReport]:
    out = tmp_path / f"{agent}.jsonl"
    opts = AgentRecordOptions(
        agent=f"tests.scripted_agents:{agent}", suite="builtin", n=2, out=out, recheck=recheck
    )
    record_agent(opts)
    return out, audit(out, AuditOptions())


def by_name(rep: AuditReport) -> dict[str, dict[str, int]]:
    control = {s.session_id: s for s in rep.states if s.method == "b0"}
    return {
        c.name: c.counts for c in channels([s for s in rep.states if s.method == "agent"], control=control)
    }


def outcomes(rep: AuditReport, rules: list[str]) -> dict[str, str]:
    return {g.rule: g.outcome for g in evaluate(rep, rules)}


def test_a_forget_that_passes_at_once_and_comes_back_after_a_restart_is_a_failed_forget(
    tmp_path: Path,
) -> None:
    bundle, rep = run(tmp_path, "write_behind")
    agent = [s for s in read_bundle(bundle).sessions if s.session.method == "agent"]
    for s in agent:
        first, *after = s.residues
        assert first.after == "" and first.store_items_with_z == 0  # the forget passed the first check
        assert [r.after for r in after] == list(RECHECK)
        assert (after[0].store_items_with_z or 0) > 0 and (after[0].replies_with_z or 0) > 0
    got = by_name(rep)
    assert got["after.restart"]["leaked"] == 2  # the restarted agent says z again
    assert got["after.turns-2"]["leaked"] == 2  # and it stays back
    assert got["after the rechecks"]["leaked"] == 2
    verdict = outcomes(rep, ["agent.residue_store==0", "agent.after.restart==0"])
    assert verdict == {"agent.residue_store==0": "failed", "agent.after.restart==0": "failed"}
    said = "\n".join(residue_lines(rep))
    assert "after restart: z came back in 2, held in 2 of 2 sessions (answers, store)" in said


def test_the_same_forget_without_rechecks_passes_so_the_recheck_is_what_catches_it(tmp_path: Path) -> None:
    _, rep = run(tmp_path, "write_behind", recheck=())
    assert outcomes(rep, ["agent.residue_store==0"]) == {"agent.residue_store==0": "held"}
    assert "after the rechecks" not in by_name(rep)


def test_a_forget_that_reaches_what_the_agent_persisted_stays_done_after_a_restart(tmp_path: Path) -> None:
    bundle, rep = run(tmp_path, "durable")
    got = by_name(rep)
    assert got["after.restart"]["erased"] == got["after.turns-2"]["erased"] == 2
    verdict = outcomes(rep, ["agent.residue_store==0", "agent.after.restart==0", "agent.after.turns-2==0"])
    assert set(verdict.values()) == {"held"}
    # each hold earned in its own channel: the no-forget tenant met the same events and kept z through them
    control = [s for s in read_bundle(bundle).sessions if s.session.method == "b0"]
    assert all([r.after for r in s.residues[1:]] == list(RECHECK) for s in control)
    restart = evaluate(rep, ["agent.after.restart==0"])[0]
    assert "2 of 2" in restart.control and "fails it" in restart.control and "proxy" not in restart.control


def test_an_event_the_agent_lacks_is_not_measured_never_clean(tmp_path: Path) -> None:
    _, rep = run(tmp_path, "durable")  # it has restart, not compact
    got = by_name(rep)
    assert got["after.compact"]["unknown"] == 2
    assert outcomes(rep, ["agent.after.compact==0"]) == {"agent.after.compact==0": "failed"}
    assert any(
        "after compact: not measured in 2 sessions (agent lacks compact)" in x for x in residue_lines(rep)
    )


def test_a_reindex_that_rebuilds_from_rows_the_forget_left_brings_z_back(tmp_path: Path) -> None:
    """The forget deleted the index entries and left the rows: passes at once, fails after the stack's own
    re-index; the restart this agent does not offer is not measured."""
    _, rep = run(tmp_path, "stale_index", recheck=("restart", "reindex"))
    got = by_name(rep)
    assert got["after.restart"]["unknown"] == 2
    assert got["after.reindex"]["leaked"] == 2
    verdict = outcomes(rep, ["agent.residue_store==0", "agent.after.reindex==0"])
    assert verdict == {"agent.residue_store==0": "failed", "agent.after.reindex==0": "failed"}
    said = "\n".join(residue_lines(rep))
    assert "after reindex: z came back in 2, held in 2 of 2 sessions (answers, store)" in said


def test_the_prompts_of_a_recheck_are_its_own_events_calls() -> None:
    """Each residue record counts the calls serve logged under its own mark: the first record the
    post-forget phases, a recheck's record only the calls marked with its event."""

    def entry(phase: str, text: str, event: str = "") -> LogEntry:
        mark = {"key": "k", "tenant": "r-s0-agent", "phase": phase, "event": event}
        return logged(
            endpoint="/v1/chat/completions", mark=mark, messages=[{"role": "user", "content": text}]
        )

    entries = [
        entry("future", "nothing here"),
        entry("recheck", "my IBAN is DE89370400440532013000", "restart"),
        entry("recheck", "small talk", "turns-2"),
    ]

    class Trace:  # what context_residue reads of a session
        session_id = "s0/agent"

        @staticmethod
        def matcher():  # type: ignore[no-untyped-def]
            from eu_audit.matching import TargetMatcher

            return TargetMatcher.of("DE89370400440532013000")

    def of(after: str) -> ResidueRecord:
        r = ResidueRecord(session_id="s0/agent", after=after)
        return context_residue(r, entries, Trace(), "d", True, "k", "r-s0-agent")  # type: ignore[arg-type]

    assert (of("").context_calls, of("").context_calls_with_z) == (1, 0)
    assert (of("restart").context_calls, of("restart").context_calls_with_z) == (1, 1)
    assert (of("turns-2").context_calls, of("turns-2").context_calls_with_z) == (1, 0)


def test_a_restart_that_never_comes_back_fails_the_run_naming_the_step_and_writes_no_bundle(
    tmp_path: Path,
) -> None:
    out = tmp_path / "b.jsonl"
    proc = run_cli(
        "record", "--agent", "tests.scripted_agents:no_coming_back", "--suite", "builtin", "--n", "1",
        "--recheck", "restart", "-o", str(out),
    )  # fmt: skip
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "recheck restart" in proc.stderr and "the journal is gone" in proc.stderr
    assert not out.exists() and not (tmp_path / "b.jsonl.state").exists()


def test_an_agent_whose_stack_does_not_import_or_start_fails_the_run_naming_the_agent(tmp_path: Path) -> None:
    """A stack that is missing or broken is a failed run (exit 3, which agent and which step), not a
    usage mistake; a module that is not there at all is one (exit 2)."""
    for spec, code, said in (
        ("tests.scripted_broken_stack:agent", 3, "import: ModuleNotFoundError"),
        ("tests.scripted_agents:no_such_factory", 2, "cannot import"),
        ("tests.no_such_module:agent", 2, "cannot import"),
    ):
        proc = run_cli("record", "--agent", spec, "--suite", "builtin", "-o", str(tmp_path / "b.jsonl"))
        assert proc.returncode == code and said in proc.stderr and spec in proc.stderr, (spec, proc.stderr)
        assert not (tmp_path / "b.jsonl").exists()


def test_recheck_mistakes_exit_2_before_any_agent_runs() -> None:
    for value, said in (
        ("reboot", "unknown event (known: at-once, compact, reindex, restart, turns-N)"),
        ("turns-0", "N must be between 1 and 50"),
        ("restart,restart", "restart named twice"),
    ):
        with pytest.raises(BadInput, match=re.escape(said)):
            parse_rechecks(value)
    proc = run_cli("record", "--agent", "tests.scripted_agents:durable", "--recheck", "reboot")
    assert proc.returncode == 2 and "unknown event" in proc.stderr, proc.stderr
    proc = run_cli("record", "--suite", "builtin", "--recheck", "restart")
    assert proc.returncode == 2 and "only with --agent" in proc.stderr


def test_a_copy_later_turns_evict_is_seen_only_by_the_check_right_after_the_forget(tmp_path: Path) -> None:
    """The forget cleans the notebook and leaves a window of recent inputs (mem0's last-10 ``messages``
    table, which its extraction prompt renders) that later turns evict: the first dump, taken after those
    turns and the probes, finds nothing; ``at-once`` reads the dump before them and finds z."""
    bundle, rep = run(tmp_path, "windowed", recheck=("turns-2", "at-once"))
    for s in [s for s in read_bundle(bundle).sessions if s.session.method == "agent"]:
        first, *after = s.residues
        assert first.store_items_with_z == 0  # evicted by the time of the first dump
        assert [r.after for r in after] == ["at-once", "turns-2"]  # at once runs first, wherever listed
        assert after[0].store_tiers.get("window", 0) > 0 and after[0].replies is None
    got = by_name(rep)
    assert got["after.at-once"]["suppressed"] == 2  # its answers never carried the window
    verdict = outcomes(rep, ["agent.residue_store==0", "agent.after.at-once==0", "agent.after.turns-2==0"])
    assert verdict == {
        "agent.residue_store==0": "failed",
        "agent.after.at-once==0": "failed",
        "agent.after.turns-2==0": "held",
    }
    said = "\n".join(residue_lines(rep))
    assert "after at-once: z held in 2 of 2 sessions (store)" in said
    assert "came back" not in said  # there from the start, never "back"


def test_without_the_check_at_once_the_same_forget_passes_the_store_rule(tmp_path: Path) -> None:
    _, rep = run(tmp_path, "windowed", recheck=("turns-2",))
    assert outcomes(rep, ["agent.residue_store==0"]) == {"agent.residue_store==0": "held"}
