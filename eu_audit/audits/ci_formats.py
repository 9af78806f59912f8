"""An audit in the formats CI systems show: SARIF 2.1.0 for code scanning (one result per rule that did not
hold, naming the channel and the quoted place) and a Markdown job summary (GitHub's
``$GITHUB_STEP_SUMMARY``): the verdict word, one row per rule, the channels where z stayed.

Both read the same verdicts as the terminal summary and JUnit (``GateResult``), and the same channels
(``eu_audit.audits.channels``); masked exactly as the audit they come from."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from eu_audit import __version__
from eu_audit.audits.model import FLOOR, AuditReport, GateResult
from eu_audit.audits.rules import CONTROL
from eu_audit.errors import BadInput

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
INFORMATION_URI = "https://pypi.org/project/eu-audit/"
#: a rule's outcome -> SARIF level: a failure is an error; a rule that could not decide is a warning
LEVELS = {"failed": "error", "inconclusive": "warning", "insensitive": "warning"}


def channel_of(metric: str) -> str:
    """The channel row a rule on ``metric`` reads (a metric's own ``channel``; a channel rule names it)."""
    from eu_audit.audits.metric import METRICS

    if "." in metric:
        return metric
    return METRICS.get(metric).channel if metric in METRICS else ""


def rule_description(rule_text: str) -> str:
    """What a rule measures, in the words its metric (or its channel kind) gives; "" for a pseudo-rule."""
    from eu_audit.audits.channel_kinds import CHANNEL_KINDS
    from eu_audit.audits.gate import PSEUDO_RULES, parse_rule
    from eu_audit.audits.metric import METRICS

    if rule_text in PSEUDO_RULES:
        return ""
    metric = parse_rule(rule_text).metric
    if "." in metric:
        kind = CHANNEL_KINDS.get(metric.split(".", 1)[0])
        return f"z counted in the {kind.label}: {metric}" if kind else ""
    return METRICS.get(metric).description if metric in METRICS else ""


def rule_defined_by(rep: AuditReport, rule_text: str) -> str:
    """The distribution that defined a rule's metric, as the audit recorded it (``defined_by``)."""
    from eu_audit.audits.gate import PSEUDO_RULES, parse_rule

    ours = f"eu-audit=={rep.tool_version or __version__}"
    if rule_text in PSEUDO_RULES:
        return ours
    return rep.defined_by.get(f"metrics:{parse_rule(rule_text).metric}", ours)


def rule_place(rep: AuditReport, g: GateResult) -> tuple[str, str]:
    """The channel a rule reads and one place where z was found there (quoted, masked as the audit is),
    or why there is none; ("", "") for a rule with no channel (cost, utility, a white-box metric)."""
    from eu_audit.audits.channels import channels
    from eu_audit.audits.gate import PSEUDO_RULES, parse_rule

    if g.rule in PSEUDO_RULES or rep.side != "black":
        return "", ""
    rule = parse_rule(g.rule)
    name = channel_of(rule.metric)
    if not name:
        return "", ""
    states = [s for s in rep.states if s.method == rule.method and not s.error]
    floor = {s.session_id: s for s in rep.states if s.method == FLOOR and not s.error} if rep.floor else None
    control = {s.session_id: s for s in rep.states if s.method == CONTROL and not s.error} or None
    got = {c.name: c for c in channels(states, floor, control)}
    # a rule over several prompt tiers (prompt.history) has no row of its own: the row over every tier
    c = got.get(name) or got.get(channel_of("residue_context") if name.startswith("prompt.") else "")
    if c is None:
        return name, "no session held z there"
    place = " ".join((c.example or c.why_unknown).split())
    return c.name, f"{c.headline} in {c.counts[c.headline]} session(s)" + (f": {place}" if place else "")


def sarif(rep: AuditReport, artifact: str) -> dict[str, Any]:
    """A SARIF 2.1.0 log: one result per rule that failed, was inconclusive or insensitive; ``artifact``
    is the file each result points at (the audited bundle, or the agent's source), relative to the
    repository root the CI checks out."""
    from eu_audit.audits.gate import gate_results

    gates = gate_results(rep)
    rules = [
        {
            "id": g.rule,
            "name": g.rule,
            "shortDescription": {"text": f"eu-audit rule {g.rule}"},
            **({"fullDescription": {"text": what}} if (what := rule_description(g.rule)) else {}),
            "helpUri": INFORMATION_URI,
            # the package that defined the rule's metric (a plug-in's, with its version; eu-audit's own)
            "properties": {"definedBy": rule_defined_by(rep, g.rule)},
        }
        for g in gates
    ]
    results = []
    for index, g in enumerate(gates):
        if g.outcome not in LEVELS:
            continue
        channel, place = rule_place(rep, g)
        where = f" Channel {channel}: {place}." if channel else ""
        decide = f" n >= {g.n_needed} would decide." if g.n_needed and g.outcome == "inconclusive" else ""
        result: dict[str, Any] = {
            "ruleId": g.rule,
            "ruleIndex": index,
            "level": LEVELS[g.outcome],
            "kind": "fail",
            "message": {"text": f"{g.rule}: {g.outcome} (n = {g.n}; {g.test}).{where}{decide} {g.detail}"},
            "locations": [
                {
                    "physicalLocation": {"artifactLocation": {"uri": artifact}, "region": {"startLine": 1}},
                    # the place itself (a prompt tier; the agent's file, table and column; a WAL frame):
                    # the bundle is where the evidence is kept, this is where z is
                    **(
                        {
                            "logicalLocations": [
                                {"name": channel, "fullyQualifiedName": place[:500], "kind": "resource"}
                            ]
                        }
                        if channel
                        else {}
                    ),
                }
            ],
            "properties": {"outcome": g.outcome, "n": g.n, "test": g.test, "model": rep.model},
        }
        results.append(result)
    return {
        "$schema": SARIF_SCHEMA,
        "version": SARIF_VERSION,
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "eu-audit",
                        "version": rep.tool_version or __version__,
                        "informationUri": INFORMATION_URI,
                        "rules": rules,
                    }
                },
                "invocations": [
                    {"executionSuccessful": True, "commandLine": rep.command or "eu-audit audit"}
                ],
                "results": results,
            }
        ],
    }


def summary_markdown(rep: AuditReport) -> str:
    """A job summary a reader takes in at a glance: one word, one row per rule (outcome, n, what would
    decide it), the channels where z stayed with one quoted place, and where the details are."""
    from eu_audit.audits.gate import gate_results
    from eu_audit.audits.output import channel_lines, tamper_lines
    from eu_audit.audits.rules import overall

    gates = gate_results(rep)
    word = overall([g.outcome for g in gates])
    sessions = len({s.session_id for s in rep.states})
    lines = [
        f"### eu-audit: **{word}** ({sessions} sessions, {rep.model} on {rep.engine})",
        "",
        "| rule | verdict | n | would decide |",
        "|---|---|---|---|",
    ]
    for g in gates:
        decide = f"n >= {g.n_needed}" if g.n_needed and g.outcome != "held" else ""
        lines.append(f"| `{g.rule}` | {g.outcome} | {g.n} | {decide} |")
    lines.append("")
    for g in gates:
        if g.outcome in LEVELS:
            channel, place = rule_place(rep, g)
            if channel:
                lines.append(f"- `{g.rule}`: {channel}: {_cell(place)}")
    extra = [*tamper_lines(rep), *channel_lines(rep)]
    if extra:
        lines += ["", "<details><summary>channels and tampering</summary>", ""]
        lines += [f"- {_cell(line)}" for line in extra]
        lines += ["", "</details>"]
    lines += ["", f"Command: `{rep.command or 'not recorded'}`; eu-audit {rep.tool_version}.", ""]
    return "\n".join(lines)


def _cell(text: str) -> str:
    """One line of Markdown: no line breaks, no table pipes, at most 300 characters."""
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= 300 else text[:297] + "..."


def junit_xml(report: AuditReport) -> str:
    """One test case per rule verdict: the gates when the audit had any, else each method's default rules
    against the floor (``gate.default_rules``). Held passes; failed is a failure; inconclusive is a failure
    of type ``inconclusive`` whose message says what n would decide it; an errored state is an error.
    Metrics a kind of agent cannot be measured on are not cases: they are listed in system-out."""
    from eu_audit.audits.gate import gate_results, not_measured, parse_rule

    verdicts = gate_results(report)
    root = ET.Element("testsuites", name="eu-audit")
    by_suite: dict[str, ET.Element] = {}
    counts: dict[str, list[int]] = {}
    for g in verdicts:
        try:
            rule = parse_rule(g.rule)
            suite, classname, name = rule.suite, f"{rule.suite}.{rule.method}", rule.metric
        except BadInput:  # a pseudo-rule (errored states, tampering)
            suite, classname, name = "all", "all", g.rule
        if suite not in by_suite:
            by_suite[suite] = ET.SubElement(root, "testsuite", name=f"eu-audit.{suite}")
            counts[suite] = [0, 0, 0]
        tc = ET.SubElement(by_suite[suite], "testcase", classname=classname, name=name)
        counts[suite][0] += 1
        if g.outcome == "failed" and "errored" in g.detail:
            counts[suite][2] += 1
            ET.SubElement(tc, "error", message=g.detail)
        elif g.outcome != "held":
            counts[suite][1] += 1
            channel, place = rule_place(report, g)  # where z was: the tier, the file and table, the frame
            where = f" Where: {channel}: {place}." if channel else ""
            ET.SubElement(tc, "failure", message=f"{g.detail} [{g.test}]{where}", type=g.outcome)
        else:
            control = f"; positive control: {g.control}" if g.control else ""
            ET.SubElement(tc, "system-out").text = f"held: {g.detail} [{g.test}]{control}"
    for suite, ts in by_suite.items():
        n, fails, errs = counts[suite]
        ts.set("tests", str(n))
        ts.set("failures", str(fails))
        ts.set("errors", str(errs))
    missing = not_measured(report)
    if missing:
        out = ET.SubElement(root, "system-out")
        out.text = "not measured (no rule can hold on these): " + "; ".join(
            f"{m}.{metric}: {why}" for m, metric, why in missing
        )
    return ET.tostring(root, encoding="unicode", xml_declaration=True)
