"""``eu-audit gate``, in rounds: the black-box gate run in rounds that stops once its verdict is
decided (``eu_audit.audits.stopping``).

Round r records the sessions that take each suite from the last round's n to the schedule's next
(``stopping.sessions_schedule``: 1, 2, 4, ... ``max_n``), each with ``record_agent`` exactly as a run of
that size would (the same run-wide ids and seeds, so session i is the same whichever round ran it); the
rounds so far are joined in run order under the last round's header (``_join``), audited from the
bundle alone (no model runs) and the gate's rules decided. A failure more sessions cannot undo stops
the run; otherwise the next round runs, up to ``max_n``. The bundle written is the joined one, its
header saying where the run stopped and why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from eu_audit.audits.model import GateResult
from eu_audit.audits.stopping import Stop, sessions_schedule, should_stop
from eu_audit.blackbox.facts import AgentRunFacts, StoppedFacts
from eu_audit.blackbox.options import AgentRecordOptions
from eu_audit.bundle.io import read_bundle, write_bundle
from eu_audit.defaults import ALPHA, MARGIN
from eu_audit.errors import BadInput, RunFailed
from eu_audit.jsonl import check_output_path
from eu_audit.plan import RunOptions, RunPlan
from eu_audit.progress import Progress
from eu_audit.trace.session import Bundle


@dataclasses.dataclass(frozen=True)
class Gate:
    """What decides a round: the gate sets and rules ``eu-audit audit`` would be given, with its alpha and
    margin."""

    gate_sets: tuple[str, ...] = ("forget",)
    rules: tuple[str, ...] = ()
    alpha: float = ALPHA
    margin: float = MARGIN

    def check(self) -> None:
        """Every set and rule known and well formed, before any agent runs (which methods and suites the
        rules may name is checked once the first round's bundle says)."""
        from eu_audit.audits.gate import GATE_SETS, parse_rule

        for name in self.gate_sets:
            GATE_SETS.get(name)
        for rule in self.rules:
            parse_rule(rule)

    def decide(self, bundle: Path) -> list[GateResult]:
        """Audit the bundle (read from it alone: a black-box audit runs no model) and decide the rules."""
        from eu_audit.audit import AuditOptions, audit, audit_plan
        from eu_audit.audits.gate import check_rules, evaluate, expand_gate_sets

        opts = AuditOptions(alpha=self.alpha, margin=self.margin)
        plan = audit_plan(bundle, opts)
        rules = [*expand_gate_sets(self.gate_sets, plan.methods, plan.side, plan.measurable), *self.rules]
        check_rules(rules, plan.methods, plan.suites)
        return evaluate(audit(bundle, opts), rules)


def round_path(out: Path, r: int) -> Path:
    return out.with_name(f"{out.stem}.round-{r}{out.suffix or '.jsonl'}")


def most_sessions(opts: RunOptions) -> int:
    """A run in rounds' most sessions per suite (its ``--n``), refused where rounds cannot run: without
    ``--n``, on a shard, or on a slice (white-box and black-box alike)."""
    n = opts.n
    if opts.shard is not None:
        raise BadInput(
            "--until-decided with --shard: a shard cannot see the other shards' failures; run the rounds "
            "on one machine, or shard a run of fixed --n"
        )
    if opts.sessions is not None:
        raise BadInput(
            "--until-decided with --sessions: the rounds choose the sessions; record a slice of a run of "
            "fixed --n, or the rounds from the first session"
        )
    if n is None:
        raise BadInput("--until-decided needs --n: the most sessions per suite the rounds may reach")
    return n


def check_rounds(opts: AgentRecordOptions) -> int:
    """The run's most sessions per suite, refused before any agent runs where rounds cannot be decided."""
    n = most_sessions(opts)
    if not opts.positive_control:
        raise BadInput(
            "--until-decided with --no-positive-control: a hold needs the no-forget control at the same n, "
            "so no round could ever hold a rule on z"
        )
    return n


def record_until_decided(
    opts: AgentRecordOptions, gate: Gate, progress: Progress | None = None
) -> tuple[Bundle, Path, Stop]:
    """Record in rounds until the gate is decided (module docstring): the joined bundle, where it was
    written, and where and why the run stopped."""
    max_n = check_rounds(opts)
    gate.check()
    plan = RunPlan.make(opts.suite, max_n, opts.out, state_dir=opts.state_dir, shard=None, force=opts.force)
    schedule = sessions_schedule(max_n)
    parts = [round_path(plan.out, r) for r in range(1, len(schedule) + 1)]
    joined = plan.out.with_name(f"{plan.out.stem}.rounds-joined{plan.out.suffix or '.jsonl'}")
    for p in [*parts, joined]:  # a round's file is never written over a file the user kept there
        check_output_path(p, force=opts.force)
    done, stop, written = 0, None, []
    try:
        for r, m in enumerate(schedule, 1):
            only = frozenset(s.index for s in plan.sessions if done <= plan.position_in_suite(s.index) < m)
            if progress:
                progress(f"round {r}: n = {m} of at most {max_n}", 0, len(only))
            round_opts = dataclasses.replace(
                opts, out=parts[r - 1], force=True, only=only, state_dir=plan.state_dir, n=max_n
            )
            from eu_audit.blackbox.drive import Interrupted, record_agent

            try:
                record_agent(round_opts, progress)
                written.append(parts[r - 1])
                current = _join(written, joined)
                stop = should_stop(gate.decide(current), m, max_n)
            except (Interrupted, KeyboardInterrupt) as exc:  # ^C, SIGTERM: the sessions done are kept
                if isinstance(exc, Interrupted) and exc.out is not None:
                    written.append(parts[r - 1])
                _keep_interrupted(written, joined, plan.out, f"in round {r} of {len(schedule)}")
            done = m
            if stop is not None:
                break
        assert stop is not None  # the schedule ends at max_n, where should_stop always stops
        bundle = _with_stop(read_bundle(current), stop, schedule[: len(written)], plan.out)
        write_bundle(plan.out, bundle.records())
    finally:
        for p in [*parts, joined]:
            if p != plan.out:
                p.unlink(missing_ok=True)
    return bundle, plan.out, stop


def _keep_interrupted(written: list[Path], joined: Path, out: Path, when: str) -> NoReturn:
    """The sessions of the rounds recorded before an interruption (the last one's finished sessions
    too), joined into ``out`` under a header marked interrupted; then the run fails (exit 3)."""
    if not written:
        raise RunFailed(f"interrupted {when}, before its first session was recorded; nothing was written")
    bundle = read_bundle(_join(written, joined))
    n = len({s.session.parent_session for s in bundle.sessions})
    bundle.header.engine_facts["interrupted"] = f"{when}, after {n} session(s)"
    write_bundle(out, Bundle(header=bundle.header, sessions=bundle.sessions, path=out).records())
    raise RunFailed(
        f"interrupted {when}: the {n} session(s) recorded are in {out}, its header marked interrupted (an "
        "audit of it says so, and decides nothing the rounds had not); record again with --force"
    )


def _join(parts: Sequence[Path], joined: Path) -> Path:
    """The rounds so far as one bundle: every round's sessions in run order, under the last round's header
    (one serve, one agent, one control key), with each round's serve-log digest kept
    (``StoppedFacts.serve_logs``) in place of the header's one."""
    if len(parts) == 1:
        return parts[0]
    from eu_audit.shards import run_order

    bundles = [read_bundle(p) for p in parts]
    sessions = sorted(
        (s for b in bundles for s in b.sessions), key=lambda s: run_order(s.session.index, s.session_id)
    )
    facts = AgentRunFacts.of(bundles[-1].header.engine_facts, str(parts[-1]))
    facts.stopped = StoppedFacts(
        n=1, max_n=1, why="", early=False, serve_logs=[_log_digest(b) for b in bundles]
    )
    facts.serve_log_digest = ""
    header = bundles[-1].header.model_copy(update={"engine_facts": facts.engine_facts()})
    write_bundle(joined, Bundle(header=header, sessions=sessions, path=joined).records())
    return joined


def _log_digest(bundle: Bundle) -> str:
    return str(bundle.header.engine_facts.get("serve_log_digest", ""))


def _with_stop(bundle: Bundle, stop: Stop, rounds: list[int], out: Path) -> Bundle:
    """The joined bundle with the stop in its header (``AgentRunFacts.stopped``)."""
    facts = AgentRunFacts.of(bundle.header.engine_facts)
    logs = facts.stopped.serve_logs if facts.stopped else [facts.serve_log_digest]
    facts.stopped = StoppedFacts(
        n=stop.n, max_n=stop.max_n, why=stop.why, early=stop.early, rounds=rounds, serve_logs=logs
    )
    header = bundle.header.model_copy(update={"engine_facts": facts.engine_facts()})
    return Bundle(header=header, sessions=bundle.sessions, path=out)
