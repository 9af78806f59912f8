"""The white-box run in rounds (``eu-audit record --until-decided --methods b7``): record each round's
sessions on the runtime, forget and audit them, and stop once the gate set is decided, as
``eu_audit.rounds`` does for the black-box gate.

Round r records the sessions that take each suite from the last round's n to the schedule's next
(``stopping.sessions_schedule``: 1, 2, 4, ... ``max_n``) with the run-wide ids and seeds of a run of
``max_n`` (``RunPlan``'s ``only``: session i is the same whichever round ran it), then audits them
(``audit.audit`` on the recording: the methods under test with the floor B5 and the no-forget control B0
applied first, the states audited). The rounds' audits so far are merged (``audits.merge.merge_reports``:
the states joined, every cell and p-value recomputed over all of them, as one audit of those sessions
would be) and the gate's rules decided on the merge. ``stopping.should_stop`` says when to stop: a failure
more sessions cannot undo (a fact, the betting test) ends the run at the round that shows it; every other
verdict waits for ``max_n``, so a run that reaches it holds exactly a fixed-n run's data.

At the end the rounds' recordings are one bundle (``out``, its header saying where the run stopped and
why) and the merged audit is returned; every round's own files are removed.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from eu_audit.audits.model import AuditReport
from eu_audit.audits.stopping import Stop, sessions_schedule, should_stop
from eu_audit.bundle.io import file_digest
from eu_audit.jsonl import atomic_writer, check_output_path
from eu_audit.plan import RunPlan
from eu_audit.progress import Progress
from eu_audit.rounds import Gate, most_sessions, round_path

if TYPE_CHECKING:
    from eu_audit.audit import AuditOptions
    from eu_audit.models import LoadedModel
    from eu_audit.record import RecordOptions

#: where the stop is written in the joined recording's header
STOPPED_FACT = "stopped"


@dataclasses.dataclass(frozen=True)
class WhiteBoxRounds:
    """What decides a white-box round: the audit's options (its methods under test, k, the floor) and
    the gate (its sets and rules, alpha and margin)."""

    audit: AuditOptions
    gate: Gate


def record_until_decided_white(
    rec: RecordOptions,
    rounds: WhiteBoxRounds,
    progress: Progress | None = None,
    loaded: LoadedModel | None = None,
) -> tuple[AuditReport, list[str], Stop]:
    """Record, forget and audit in rounds until the gate is decided (module docstring): the merged audit
    (unmasked: the caller masks it), the rules it was decided by, and where and why the run stopped."""
    from eu_audit.audit import audit
    from eu_audit.audits.gate import evaluate
    from eu_audit.audits.merge import merge_reports
    from eu_audit.record import record

    max_n = most_sessions(rec)
    gate = rounds.gate
    gate.check()
    plan = RunPlan.make(rec.suite, max_n, rec.out, state_dir=rec.state_dir, shard=None, force=rec.force)
    rules = white_rules(rounds, sorted({ep.suite for ep in plan.episodes}))  # refused before any model loads
    schedule = sessions_schedule(max_n)
    recordings = [round_path(plan.out, r) for r in range(1, len(schedule) + 1)]
    audits = [_round_files(p)[-1] for p in recordings]
    for part in recordings:  # a round's file is never written over a file the user kept there
        for p in _round_files(part):
            check_output_path(p, force=rec.force)
    done, stop, merged = 0, None, None
    try:
        for r, m in enumerate(schedule, 1):
            only = frozenset(s.index for s in plan.sessions if done <= plan.position_in_suite(s.index) < m)
            if progress:
                progress(f"round {r}: n = {m} of at most {max_n}", 0, len(only))
            part = recordings[r - 1]
            record(
                dataclasses.replace(rec, out=part, force=True, only=only, state_dir=None), progress, loaded
            )
            report = audit(part, rounds.audit, progress=progress, loaded=loaded)
            with atomic_writer(audits[r - 1], private=True) as f:  # unmasked: it goes when the run ends
                f.write(report.model_dump_json())
            merged = report if r == 1 else merge_reports(audits[:r])
            stop = should_stop(evaluate(merged, rules, alpha=gate.alpha, margin=gate.margin), m, max_n)
            done = m
            if stop is not None:
                break
        assert stop is not None and merged is not None  # the schedule ends at max_n, where it always stops
        ran = schedule.index(stop.n) + 1
        _join_recordings(recordings[:ran], plan.out, stop)
        # the audit names what stays: the joined recording (the rounds' files and states are removed)
        merged = merged.model_copy(
            update={
                "bundle": str(plan.out),
                "bundle_digest": file_digest(plan.out),
                "unlearned": None,
                "cost": {**merged.cost, "rounds": ran},
            }
        )
    finally:
        for part in recordings:
            for p in _round_files(part):
                p.unlink(missing_ok=True)
            shutil.rmtree(part.with_name(part.name + ".state"), ignore_errors=True)
    return merged, rules, stop


def white_rules(rounds: WhiteBoxRounds, suites: list[str]) -> list[str]:
    """The rules every round is decided by: the gate sets expanded for the methods the audit runs (those
    asked for, the floor and the control), then the gate's own; each checked against them and the run's
    suites."""
    from eu_audit.audit import with_floor_and_control
    from eu_audit.audits.gate import check_rules, expand_gate_sets
    from eu_audit.unlearn import parse_methods

    methods = with_floor_and_control(parse_methods(list(rounds.audit.methods)), rounds.audit.floor)
    rules = [*expand_gate_sets(rounds.gate.gate_sets, methods, "white"), *rounds.gate.rules]
    check_rules(rules, methods, suites)
    return rules


def _round_files(part: Path) -> list[Path]:
    """A round's own files: its recording, its post-forget states and their progress file (``audit``
    writes them beside the recording), and its audit."""
    states = part.with_name(f"{part.stem}.audit-states{part.suffix}")
    progress = states.with_name(states.stem + ".audit-progress.jsonl")
    return [part, states, progress, part.with_suffix(".audit.json")]


def _join_recordings(parts: list[Path], out: Path, stop: Stop) -> None:
    """The rounds' recordings as one bundle in run order, the stop in its header."""
    from eu_audit.bundle.io import read_bundle, write_bundle
    from eu_audit.shards import run_order
    from eu_audit.trace.session import Bundle

    bundles = [read_bundle(p) for p in parts]
    sessions = sorted(
        (s for b in bundles for s in b.sessions), key=lambda s: run_order(s.session.index, s.session_id)
    )
    facts = dict(bundles[-1].header.engine_facts)
    facts[STOPPED_FACT] = {"n": stop.n, "max_n": stop.max_n, "why": stop.why, "early": stop.early}
    header = bundles[-1].header.model_copy(update={"engine_facts": facts})
    write_bundle(out, Bundle(header=header, sessions=sessions, path=out).records())
