"""``eu-audit audit``: audit the post-forget states against the floor, with verdicts and gates."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from eu_audit.audits.gate import describe_gate_sets
from eu_audit.build_info import command_line
from eu_audit.cli.app import (
    Force,
    ShardOption,
    SigningKey,
    app,
    err,
    out,
    progress_bar,
    say,
)
from eu_audit.defaults import ALPHA, ANSWER_MAX_TOKENS, MARGIN, SAMPLE_TEMPERATURE, SAMPLES_K
from eu_audit.errors import BadInput
from eu_audit.shards import Shard

AuditBundlePath = Annotated[
    Path, typer.Argument(help="A recorded bundle (methods are applied first) or one unlearn produced.")
]
AuditMethod = Annotated[
    list[str], typer.Option("--method", "-m", help="Methods to audit (comma list, repeated, or 'all').")
]
AuditFloor = Annotated[
    bool,
    typer.Option("--floor/--no-floor", help="Measure against the B5 floor (B5 is added if missing)."),
]
AuditK = Annotated[int, typer.Option(min=1, help="Samples per state for Leak@k and the distribution audit.")]
AuditTemperature = Annotated[float, typer.Option(min=0.0, help="Sampling temperature of those samples.")]
AuditMaxTokens = Annotated[int, typer.Option(min=1, help="Tokens per probe answer / sample.")]
AuditMargin = Annotated[
    float,
    typer.Option(
        min=0.0, help="How close to the floor a method must be shown to be (a floor rule's upper bound)."
    ),
]
AuditAlpha = Annotated[
    float,
    typer.Option(
        min=0.0001, max=0.5, help="One-sided significance of the gates' tests and confidence bounds."
    ),
]
AuditOnInconclusive = Annotated[
    str,
    typer.Option(
        help="fail (exit 4, the default: add sessions to decide) or pass (accept an undecided rule, "
        "explicitly)."
    ),
]
AuditOnInsensitive = Annotated[
    str,
    typer.Option(
        help="fail (exit 4, the default: a rule its positive control did not fail cannot tell a forget "
        "from none) or pass (accept such a rule, explicitly; it stays insensitive in JSON, JUnit, receipt)."
    ),
]
AuditSeed = Annotated[int, typer.Option(help="Seed the sample seeds derive from (recorded in the report).")]
AuditGate = Annotated[
    list[str] | None,
    typer.Option(help="Rule METHOD[.SUITE].METRIC OP VALUE|floor, e.g. 'b7.leak_probes<=floor'; repeatable."),
]
AuditGateSet = Annotated[
    list[str] | None,
    typer.Option(
        help=f"A named set of rules every audited method is held to: {describe_gate_sets()}. Combines with "
        "--gate; plugins add sets (eu_audit.gate_sets)."
    ),
]
AuditJsonPath = Annotated[Path | None, typer.Option("--json", help="Write the report (eu-audit/audit@1).")]
AuditJunitPath = Annotated[
    Path | None, typer.Option("--junit", help="Write JUnit XML (method x suite x audit).")
]
AuditSarif = Annotated[
    Path | None,
    typer.Option(
        "--sarif",
        help="Write SARIF 2.1.0 for code scanning: one result per rule that failed (error) or could not "
        "decide (warning), naming the channel and the quoted place.",
    ),
]
AuditSummaryMd = Annotated[
    Path | None,
    typer.Option(
        "--summary-md",
        help="Write a Markdown summary (verdict, one row per rule, where z stayed). Under GitHub Actions it "
        "is also appended to $GITHUB_STEP_SUMMARY, the job's summary page.",
    ),
]
AuditStatesOut = Annotated[
    Path | None,
    typer.Option(help="Where the post-forget states go (default: <input>.audit-states.jsonl)."),
]
AuditRowsPath = Annotated[
    Path | None,
    typer.Option(
        "--rows", help="Write one row per session x method with every metric, as Parquet (a data set)."
    ),
]
AuditServing = Annotated[
    bool,
    typer.Option(
        "--serving",
        help="Also measure serving-layer residue on a served engine: serving.residual_cached_tokens "
        "(the prefix that carried z, still cached) and serving.reset_effective (after the "
        "server's own reset).",
    ),
]
AuditServer = Annotated[
    str | None, typer.Option(help="For a bundle recorded on --engine openai: the server (overrides).")
]
AuditRevealTarget = Annotated[
    bool,
    typer.Option(
        help="Keep the target's text in what the audit prints and writes, for a local investigation (files "
        "0600). By default every place z stayed is shown masked: \\[z:DIGEST], a salted digest of the span.",
    ),
]
AuditAttest = Annotated[
    Path | None,
    typer.Option(
        help="Write a signed forget receipt here: an in-toto Statement (test-result predicate) in a DSSE "
        "envelope, subjects the bundle, the --json audit, the weights and each --subject. Needs --json and "
        "--signing-key.",
    ),
]
AuditSubject = Annotated[
    list[Path] | None,
    typer.Option(help="More subjects of the receipt: the agent build, a container digest file."),
]


@app.command("audit")
def audit_command(
    bundle_path: AuditBundlePath,
    method: AuditMethod = ["all"],  # noqa: B006 - typer reads the default
    floor: AuditFloor = True,
    k: AuditK = SAMPLES_K,
    temperature: AuditTemperature = SAMPLE_TEMPERATURE,
    max_tokens: AuditMaxTokens = ANSWER_MAX_TOKENS,
    margin: AuditMargin = MARGIN,
    alpha: AuditAlpha = ALPHA,
    on_inconclusive: AuditOnInconclusive = "fail",
    on_insensitive: AuditOnInsensitive = "fail",
    seed: AuditSeed = 0,
    gate: AuditGate = None,
    gate_set: AuditGateSet = None,
    json_path: AuditJsonPath = None,
    junit_path: AuditJunitPath = None,
    sarif_path: AuditSarif = None,
    summary_md: AuditSummaryMd = None,
    states_out: AuditStatesOut = None,
    rows_path: AuditRowsPath = None,
    serving: AuditServing = False,
    server: AuditServer = None,
    force: Force = False,
    shard: ShardOption = None,
    reveal_target: AuditRevealTarget = False,
    attest: AuditAttest = None,
    signing_key: SigningKey = None,
    subject: AuditSubject = None,
) -> None:
    """Audit forgetting: Leak@probes, Leak@k, behavioral extraction, CAD, utility and the distribution
    under sampling, each next to the B5 floor, with paired statistics; exit 1 when a --gate fails.

    The levers on cost: [bold]--n[/] and [bold]--suite[/] at record time (sessions), [bold]-m[/] (methods)
    and [bold]--k[/] (samples per state). A long audit keeps each finished state in
    <states>.audit-progress.jsonl: run the same command again after an interruption and it resumes.

    Each --gate is held, failed, inconclusive or insensitive: against the floor, failed when the method is
    significantly worse at --alpha (one-sided, by the metric: exact McNemar on 0/1 outcomes, a betting
    test on rates, Wilcoxon on counts and seconds), held when the upper confidence
    bound of its difference is within --margin, inconclusive otherwise (with the n that would decide);
    X==0 on a residue or leak is a fact: one session with z fails it. A rule on z (leakage, probes,
    behavior, CAD) has a positive control, B0 (no forget): where B0 never broke it on the rule's sessions
    the rule is insensitive, never held (B0's rate is printed beside each rule; audit -m b0,... keeps it
    in the run). `eu-audit power` sizes a run.
    [bold]--gate-set forget[/] is the recommended rule list, written once (the README's CI recipe uses it).

    Exit codes: 0 every gate held, 1 a gate failed or a state errored, 2 bad input, 3 the run failed,
    4 no gate failed but one is inconclusive (add sessions in a fresh run sized by eu-audit power;
    --on-inconclusive pass accepts it) or insensitive (--on-insensitive pass accepts it).

    Example:

    [bold]eu-audit audit trace.jsonl --floor --gate 'b7.leak_probes<=floor' --gate 'b7.cad==0'[/]
    [bold]eu-audit audit bb.jsonl --gate-set forget --json audit.json --junit junit.xml[/]
    """
    from eu_audit.audit import AuditOptions, audit_plan
    from eu_audit.audit import audit as run_audit
    from eu_audit.audits.gate import check_rules, expand_gate_sets
    from eu_audit.jsonl import check_output_path

    check_acceptance(on_inconclusive, on_insensitive)
    for path in (json_path, junit_path, rows_path, sarif_path, summary_md):
        if path is not None:
            check_output_path(path, force=force)  # refused now, not after hours of compute
    if states_out is not None:
        check_output_path(states_out)  # the states resume: an existing file is this audit's own
    opts = AuditOptions(
        methods=method,
        floor=floor,
        k=k,
        temperature=temperature,
        max_tokens=max_tokens,
        margin=margin,
        alpha=alpha,
        seed=seed,
        unlearned_out=states_out,
        serving=serving,
        server=server,
        command=command_line(),
    )
    if attest is not None:
        check_attest(attest, json_path, signing_key, subject or [], force)
    if shard:
        from eu_audit.shards import shard_bundle

        bundle_path = shard_bundle(bundle_path, Shard.parse(shard))
    # a bad rule, or one naming a method this audit will not measure, is bad input before any model runs
    plan = audit_plan(bundle_path, opts)
    rules = [*expand_gate_sets(gate_set or [], plan.methods, plan.side, plan.measurable), *(gate or [])]
    check_rules(rules, plan.methods, plan.suites)
    with progress_bar() as report:
        rep = run_audit(bundle_path, opts, progress=report)
    from eu_audit.audits.evidence import mask_for

    mask = mask_for(bundle_path)  # the bundle's targets and salt, read once
    if not reveal_target:
        rep = mask.report(rep)
    receipt = None
    if attest is not None:
        assert json_path is not None and signing_key is not None
        receipt = (attest, signing_key, [bundle_path, *(subject or [])], mask.variant_digests())
    apply_gates(
        rep,
        rules,
        (json_path, junit_path, rows_path),
        on_inconclusive,
        on_insensitive=on_insensitive,
        private=reveal_target,
        receipt=receipt,
        ci=CiOutputs(sarif_path, summary_md, str(bundle_path)),
    )


def check_acceptance(on_inconclusive: str, on_insensitive: str) -> None:
    """--on-inconclusive and --on-insensitive are fail or pass: refused before anything runs."""
    for name, value in (("--on-inconclusive", on_inconclusive), ("--on-insensitive", on_insensitive)):
        if value not in ("fail", "pass"):
            raise BadInput(f"{name} must be fail or pass, not {value!r}")


def check_attest(
    attest: Path, json_path: Path | None, key: Path | None, subjects: list[Path], force: bool
) -> None:
    """Everything a receipt needs, checked before any model runs."""
    from eu_audit.audits.evidence import load_signer
    from eu_audit.jsonl import check_output_path

    if json_path is None:
        raise BadInput("--attest needs --json: the receipt's verdict is recomputed from that audit's rows")
    if key is None:
        raise BadInput("--attest needs --signing-key (an ed25519 private key, PEM)")
    load_signer(key)
    for s in subjects:
        if not s.is_file():
            raise BadInput("the --subject does not exist (or is not a file)", path=str(s))
    check_output_path(attest, force=force)


@dataclass(frozen=True)
class CiOutputs:
    """What CI systems show: SARIF for code scanning, a Markdown job summary (``audits.ci_formats``)."""

    sarif: Path | None = None
    summary_md: Path | None = None
    artifact: str = ""  # the file SARIF results point at: the audited bundle

    def write(self, rep: Any, private: bool) -> None:
        from eu_audit.audits.ci_formats import sarif, summary_markdown
        from eu_audit.jsonl import atomic_writer

        if self.sarif is not None:
            with atomic_writer(self.sarif, private=private) as f:
                f.write(json.dumps(sarif(rep, self.artifact or rep.bundle), indent=1))
        text = summary_markdown(rep)
        if self.summary_md is not None:
            with atomic_writer(self.summary_md, private=private) as f:
                f.write(text)
        step = os.environ.get("GITHUB_STEP_SUMMARY")
        if step and not private:  # GitHub's job page: appended, as every step of the job shares the file
            try:
                with open(step, "a", encoding="utf-8") as f:
                    f.write(text + "\n")
            except OSError as exc:
                say(err, f"could not append to $GITHUB_STEP_SUMMARY ({step}): {exc.strerror}")


def apply_gates(
    rep: Any,
    rules: list[str],
    outputs: tuple[Path | None, ...],
    on_inconclusive: str,
    *,
    on_insensitive: str = "fail",
    private: bool = False,
    receipt: tuple[Path, Path, list[Path], list[str]] | None = None,
    ci: CiOutputs | None = None,
) -> None:
    """Decide the rules, print and write the report (and its receipt, SARIF and job summary), exit with
    the verdict's code: one source for the summary, the files and the exit code."""
    from eu_audit.audits.gate import evaluate, exit_code

    rep.gates = evaluate(rep, rules)
    _print_audit(rep)
    _write_audit(rep, *outputs, private=private)
    (ci or CiOutputs()).write(rep, private)
    if receipt is not None and outputs[0] is not None:
        _write_receipt(rep, outputs[0], *receipt)
    code = exit_code(
        rep.gates, inconclusive_passes=on_inconclusive == "pass", insensitive_passes=on_insensitive == "pass"
    )
    if code == 4 and on_insensitive != "pass" and any(g.outcome == "insensitive" for g in rep.gates):
        say(
            err,
            "some rules are insensitive (exit 4): the same rule did not fail for their positive control (B0, "
            "no forget), so they cannot tell a forget from none; each says what would decide it (more "
            "sessions, or a model or suite where the no-forget state leaks), or accept it with "
            "--on-insensitive pass",
        )
    if code == 4 and on_inconclusive != "pass" and any(g.outcome == "inconclusive" for g in rep.gates):
        say(
            err,
            "no rule failed, but some are inconclusive at this n (exit 4), see above: add sessions in a "
            f"fresh run sized by `eu-audit power {outputs[0] or 'AUDIT.json'}`, and gate it once",
        )
    if code:
        raise typer.Exit(code)


def _print_audit(rep: object) -> None:
    from eu_audit.audits.model import AuditReport
    from eu_audit.audits.output import summary_lines, tables

    assert isinstance(rep, AuditReport)
    for t in tables(rep):
        out.print(t)
    for line in summary_lines(rep):
        say(out, line)
    styles = {
        "held": ("held", "green"),
        "failed": ("FAILED", "bold red"),
        "inconclusive": ("INCONCLUSIVE", "yellow"),
        "insensitive": ("INSENSITIVE", "magenta"),
    }
    for g in rep.gates:
        word, style = styles[g.outcome]
        control = f"; control: {g.control}" if g.control and g.outcome != "insensitive" else ""
        say(
            out, Text(f"gate {g.rule}: "), Text(word, style=style), Text(f"  ({g.detail}; {g.test}{control})")
        )


def _write_receipt(
    rep: Any, audit_json: Path, out_path: Path, key: Path, files: list[Path], digests: list[str]
) -> None:
    from eu_audit.audits.evidence import sha256_file, sign, statement
    from eu_audit.jsonl import atomic_writer

    subjects = [(files[0].name, sha256_file(files[0])), (audit_json.name, sha256_file(audit_json))]
    if rep.model_digest:
        subjects.append((f"model-weights:{rep.model}", rep.model_digest))
    subjects += [(f.name, sha256_file(f)) for f in files[1:]]
    envelope = sign(statement(rep, subjects, audit_json.name, digests), key)
    with atomic_writer(out_path, private=False) as f:  # holds no target: digests only
        f.write(json.dumps(envelope, indent=1))
    say(
        out,
        f"signed forget receipt: {out_path} (check it with: eu-audit verify {out_path} --key PUBLIC.pem ...)",
    )


def _write_audit(
    rep: object,
    json_path: Path | None,
    junit_path: Path | None,
    rows_path: Path | None,
    *,
    private: bool = True,
) -> None:
    from eu_audit.audits.ci_formats import junit_xml
    from eu_audit.audits.model import AuditReport
    from eu_audit.audits.summary import audit_rows
    from eu_audit.jsonl import atomic_writer, write_parquet

    assert isinstance(rep, AuditReport)
    if json_path:  # 0600 always: masked by default, but it describes where z stayed
        with atomic_writer(json_path, private=True) as f:
            f.write(rep.model_dump_json(indent=1))
    if junit_path:  # a CI artifact: 0644 when masked, 0600 when it holds the target
        with atomic_writer(junit_path, private=private) as f:
            f.write(junit_xml(rep))
    if rows_path:
        write_parquet(rows_path, audit_rows(rep))
