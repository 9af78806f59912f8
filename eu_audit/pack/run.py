"""``eu-audit pack run``: each case's releases through the gate, as a CI job would gate them.

Per pack run, one ``eu-audit serve`` per model. Per case and release: the release's venv (``venvs``), the
case's agent started in it with its model at serve, the library's ``record_agent`` (the agent's own
forget, its reference and its no-forget control) and ``audit`` with the case's rules in this process (the
audit's models stay loaded from one release to the next), and the verdict compared with the
one the case expects: *failed* naming its place on the release that has the bug, *held* on the one that
fixed it. Everything runs on loopback and stops when the run does.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from eu_audit.errors import EuAuditError
from eu_audit.pack.case import Case, Release
from eu_audit.servers import child_server
from eu_audit.trace.records import AGENT_METHOD

if TYPE_CHECKING:
    from eu_audit.audits.model import AuditReport

#: the CLI as a child process (serve runs as its own server)
EU_AUDIT = [sys.executable, "-m", "eu_audit.cli"]


@dataclass
class ReleaseResult:
    """One release of one case through the gate."""

    case: str
    stack: str
    release: str
    pins: list[str]
    expect: str
    verdict: str = ""  # held / failed / inconclusive / insensitive, or "run failed"
    where: str = ""  # the evidence the failed rules named (channel and quoted place)
    named: bool = False  # the expected place is in that evidence
    as_expected: bool = False
    exit_code: int | None = None
    detail: str = ""  # a run that failed: why
    seconds: float = 0.0
    rules: dict[str, str] = field(default_factory=dict)  # rule -> outcome

    def row(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


@contextlib.contextmanager
def serving(model: str, out: Path) -> Iterator[str]:
    """``eu-audit serve`` for one model, its log and control secret where ``serve`` puts them by default."""
    out.mkdir(parents=True, exist_ok=True)
    argv = [*EU_AUDIT, "serve", "--model", model, "--log", str(out / f"serve-{model}.jsonl"), "--force"]
    with child_server(argv, "/health", out / f"serve-{model}.out") as url:
        yield url


def _evidence(rep: AuditReport, failed: list[str]) -> str:
    """The channel and quoted place each failed rule names, from the (masked) audit."""
    from eu_audit.audits.ci_formats import rule_place

    watched = [s.residue.bystander for s in rep.states if s.method == AGENT_METHOD and s.residue.bystander]
    lost = next((b.example for b in watched if b.lost), "")
    said = []
    for g in rep.gates:
        if g.rule in failed:
            channel, place = rule_place(rep, g)
            if channel:
                said.append(f"{g.rule}: {channel}: {place}")
            elif "bystander" in g.rule and lost:  # which memory of the other tenant, from which store
                said.append(f"{g.rule}: a bystander's memory lost: {lost}")
            else:
                said.append(f"{g.rule}: {g.detail}")
    return " | ".join(said)


def run_release(
    case: Case, release: Release, root: Path, serve: str, out: Path, say: Callable[[str], None]
) -> ReleaseResult:
    """One release of one case through serve, record and audit; never raises for the case's own failure
    (a release that cannot run is a result that says so)."""
    from eu_audit.audit import AuditOptions, audit
    from eu_audit.audits.evidence import mask_for
    from eu_audit.audits.gate import evaluate, exit_code
    from eu_audit.audits.rules import overall
    from eu_audit.blackbox.drive import AgentRecordOptions, record_agent
    from eu_audit.jsonl import atomic_writer
    from eu_audit.pack.venvs import venv_for

    folder = out / case.name / release.name
    folder.mkdir(parents=True, exist_ok=True)
    result = ReleaseResult(case.name, case.stack, release.name, release.pins, release.expect)
    t0 = time.monotonic()
    try:
        if case.venv:
            say(f"{case.name} {release.name}: the venv ({' '.join(release.pins)})")
            python = venv_for([*release.pins, *case.requirements], case.python, log=folder / "install.log")
        else:
            python = Path(sys.executable)
        args = [*case.agent_args, *release.agent_args]
        agent = [str(python), str(root / case.agent), "--data", str(folder / "agent-data"), *args]
        env = {"OPENAI_BASE_URL": f"{serve}/v1", "OPENAI_API_KEY": "unused"}
        bundle, audit_json = folder / "bundle.jsonl", folder / "audit.json"
        with child_server(agent, "/eu-audit/v1/capabilities", folder / "agent.out", env) as url:
            say(f"{case.name} {release.name}: eu-audit gate ({case.suite}, n = {case.n})")
            suite = case.suite_ref()
            record_agent(
                AgentRecordOptions(
                    agent=url,
                    serve=serve,
                    suite=suite,
                    n=case.n,
                    k=1,
                    seed=0,
                    out=bundle,
                    force=True,
                    recheck=tuple(case.recheck),
                )
            )
        # audited as `eu-audit audit BUNDLE --gate ... --json` does it: masked, then decided
        rep = mask_for(bundle).report(audit(bundle, AuditOptions(k=1)))
        rep.gates = evaluate(rep, case.gate)
        with atomic_writer(audit_json, private=True) as f:
            f.write(rep.model_dump_json(indent=1))
        result.exit_code = exit_code(rep.gates)
        outcomes: dict[str, str] = {g.rule: str(g.outcome) for g in rep.gates}
        result.rules = outcomes
        result.verdict = overall(list(outcomes.values()))
        failed = [r for r, o in outcomes.items() if o == "failed"]
        result.where = _evidence(rep, failed) if failed else ""
        result.named = bool(release.where) and release.where in result.where
        result.as_expected = result.verdict == release.expect and (release.expect != "failed" or result.named)
    except (EuAuditError, OSError) as exc:
        result.verdict, result.detail = "run failed", str(exc)[:400]
    result.seconds = round(time.monotonic() - t0, 1)
    return result


def run_pack(
    cases: list[Case], root: Path, out: Path, say: Callable[[str], None], releases: list[str] | None = None
) -> list[ReleaseResult]:
    """Every release of every case (or the named releases), one serve per model; the results, also
    written to ``out/results.jsonl`` as each finishes (a long pack run keeps what it finished)."""
    out.mkdir(parents=True, exist_ok=True)
    rows = out / "results.jsonl"
    results: list[ReleaseResult] = []
    for case in cases:
        if not case.runnable:
            say(f"{case.name}: skipped, not reproduced here ({case.not_reproduced})")
    runnable = [c for c in cases if c.runnable]
    for model in dict.fromkeys(c.model for c in runnable):
        with serving(model, out) as serve:
            for case in (c for c in runnable if c.model == model):
                for release in case.releases:
                    if releases and release.name not in releases:
                        continue
                    got = run_release(case, release, root, serve, out, say)
                    results.append(got)
                    with open(rows, "a") as f:
                        f.write(got.row() + "\n")
                    mark = "as expected" if got.as_expected else "NOT as expected"
                    say(f"{case.name} {release.name}: {got.verdict} ({mark}; {got.seconds:.0f} s)")
    return results
