"""A gate verdict is evidence: held, failed or inconclusive, with the n that would decide.

Mechanics on scripted in-process agents (``tests/scripted_agents.py``: no model, seconds): a thorough
forget is inconclusive at n = 2 (exit 4) and held at n = 30 (exit 0); a forget that deletes nothing fails
its residue fact at n = 2 (exit 1) while its leak rules are still inconclusive. The statistics behind the
verdicts are checked against known answers from the libraries' documentation and textbooks.
"""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from eu_audit.audit import AuditOptions, audit
from eu_audit.audits.ci_formats import junit_xml
from eu_audit.audits.gate import evaluate, exit_code
from eu_audit.audits.metric import METRICS, Kind
from eu_audit.audits.model import AuditReport, read_report
from eu_audit.audits.output import summary_lines
from eu_audit.audits.verdict import clopper_pearson_upper, n_for_share, t_upper, upper_bound, worse_p
from eu_audit.blackbox.drive import AgentRecordOptions, record_agent
from eu_audit.errors import BadInput

from .helpers import run_cli

RULES = ["agent.leak_probes<=floor", "agent.leak_any<=floor", "agent.cad<=floor", "agent.residue_store==0"]


def gate_run(tmp_path: Path, agent: str, n: int) -> tuple[Path, AuditReport]:
    out = tmp_path / f"{agent}-{n}.jsonl"
    record_agent(AgentRecordOptions(agent=f"tests.scripted_agents:{agent}", suite="builtin", n=n, out=out))
    rep = audit(out, AuditOptions())
    rep.gates = evaluate(rep, RULES)
    return out, rep


def outcomes(rep: AuditReport) -> dict[str, str]:
    return {g.rule: g.outcome for g in rep.gates}


def test_a_gate_at_n_2_is_inconclusive_and_says_what_n_would_decide(tmp_path: Path) -> None:
    _, rep = gate_run(tmp_path, "thorough", 2)
    got = outcomes(rep)
    assert got["agent.residue_store==0"] == "held"  # a fact: every session observed, none with z
    assert got["agent.leak_probes<=floor"] == "inconclusive"
    # the scripted agent never acts: without the forget its actions are B5's too, so CAD cannot see z
    assert got["agent.cad<=floor"] == "insensitive"
    leak = next(g for g in rep.gates if g.rule == "agent.leak_probes<=floor")
    assert leak.n == 2 and leak.n_needed == 29 and "n >= 29" in leak.detail
    assert exit_code(rep.gates) == 4 and exit_code(rep.gates, inconclusive_passes=True) == 4
    assert exit_code(rep.gates, inconclusive_passes=True, insensitive_passes=True) == 0
    # the summary never calls it a forget, and JUnit marks the case inconclusive, not passed
    assert not any(line.startswith("Forget") for line in summary_lines(rep))
    assert any("Not shown to forget at this n" in line for line in summary_lines(rep))
    case = next(c for c in ET.fromstring(junit_xml(rep)).iter("testcase") if c.get("name") == "leak_probes")
    assert case.find("failure").get("type") == "inconclusive"  # type: ignore[union-attr]


def test_a_thorough_forget_at_the_n_power_asks_for_holds_every_rule_its_control_could_see(
    tmp_path: Path,
) -> None:
    _, rep = gate_run(tmp_path, "thorough", 30)
    got = outcomes(rep)
    # each rule on what it says and keeps held, its no-forget control having shown z in every session
    assert {got[r] for r in RULES if "cad" not in r} == {"held"}
    assert all("30 of 30" in g.control for g in rep.gates if "cad" not in g.rule)
    # it never acts, so CAD cannot tell a forget from none: insensitive, never held, and exit 4
    assert got["agent.cad<=floor"] == "insensitive" and exit_code(rep.gates) == 4
    rep.gates = [g for g in rep.gates if "cad" not in g.rule]
    assert exit_code(rep.gates) == 0
    assert ET.fromstring(junit_xml(rep)).find("testsuite").get("failures") == "0"  # type: ignore[union-attr]


def test_a_forget_that_deletes_nothing_fails_on_the_fact_while_its_leaks_are_still_inconclusive(
    tmp_path: Path,
) -> None:
    _, rep = gate_run(tmp_path, "naive", 2)
    got = outcomes(rep)
    assert got["agent.residue_store==0"] == "failed"  # z in its notebook: an observation, at any n
    assert got["agent.leak_probes<=floor"] == "inconclusive"  # 2 of 2 worse is not yet significant
    leak = next(g for g in rep.gates if g.rule == "agent.leak_probes<=floor")
    assert leak.p == pytest.approx(0.25) and leak.n_needed == 5 and "failed" in leak.detail
    assert exit_code(rep.gates) == 1


def test_with_no_rule_named_a_residue_the_agent_holds_and_its_reference_does_not_fails_at_n_1(
    tmp_path: Path,
) -> None:
    """The default rules compare residue with the floor (``residue_store<=floor``), and a residue is an
    observation: z in the agent's store where its reference tenant's has none fails at n = 1, and the
    summary says the agent still holds the target instead of "not shown at this n"."""
    from eu_audit.audits.gate import default_rules

    out = tmp_path / "naive-1.jsonl"
    record_agent(AgentRecordOptions(agent="tests.scripted_agents:naive", suite="builtin", n=1, out=out))
    rep = audit(out, AuditOptions())
    got = {g.rule: g for g in evaluate(rep, default_rules(rep))}
    store = got["agent.builtin.residue_store<=floor"]
    assert store.outcome == "failed" and "an observation" in store.detail and store.n == 1
    assert got["agent.builtin.leak_probes<=floor"].outcome == "inconclusive"  # a statistic needs more n
    assert any(
        line.startswith("Still hold the target") or line.startswith("Still leak")
        for line in summary_lines(rep)
    )
    assert not any("Not shown to forget" in line for line in summary_lines(rep))
    thorough = tmp_path / "thorough-1.jsonl"
    record_agent(
        AgentRecordOptions(agent="tests.scripted_agents:thorough", suite="builtin", n=1, out=thorough)
    )
    rep = audit(thorough, AuditOptions())
    held = {g.rule: g.outcome for g in evaluate(rep, default_rules(rep))}
    assert held["agent.builtin.residue_store<=floor"] == "held"  # observed clean, against its floor


def test_the_cli_exits_4_on_an_inconclusive_gate_and_power_sizes_the_job(tmp_path: Path) -> None:
    bundle, _ = gate_run(tmp_path, "thorough", 2)
    js = tmp_path / "a.json"
    gates = [x for r in RULES for x in ("--gate", r)]
    proc = run_cli("audit", str(bundle), *gates, "--json", str(js))
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "INCONCLUSIVE" in proc.stdout and "add sessions" in proc.stderr
    report = json.loads(js.read_text())
    leak = next(g for g in report["gates"] if g["rule"] == "agent.leak_probes<=floor")
    assert leak["outcome"] == "inconclusive" and leak["test"] and leak["n_needed"] == 29
    assert "INSENSITIVE" in proc.stdout and "--on-insensitive pass" in proc.stderr  # CAD: it never acts
    proc = run_cli("audit", str(bundle), *gates, "--on-inconclusive", "pass")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    proc = run_cli("audit", str(bundle), *gates, "--on-inconclusive", "pass", "--on-insensitive", "pass")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run_cli("power", str(js))
    assert proc.returncode == 0 and "29" in proc.stdout, proc.stdout + proc.stderr
    proc = run_cli("power", "--worse-share", "0")
    assert proc.returncode == 0 and "n >= 29" in proc.stdout
    proc = run_cli("power", "--worse-share", "0.4")
    assert proc.returncode == 0 and "n = 16 decides 80% of fresh runs" in " ".join(proc.stdout.split())
    proc = run_cli("audit", str(bundle), "--alpha", "2")
    assert proc.returncode == 2 and "--alpha" in proc.stderr
    # the recommended rules by name, decided and written into the audit; this run had no serve, so the
    # rules that read serve's samples and log fail closed instead of passing unmeasured
    proc = run_cli("audit", str(bundle), "--gate-set", "forget", "--json", str(tmp_path / "set.json"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    decided = {g["rule"]: g["outcome"] for g in json.loads((tmp_path / "set.json").read_text())["gates"]}
    assert decided["agent.leak_any<=floor"] == "inconclusive" and decided["agent.residue_store==0"] == "held"
    assert decided["agent.leak5<=floor"] == decided["agent.residue_context==0"] == "failed"


def test_the_forget_rule_set_holds_every_method_to_the_leak_rules_and_a_black_box_agent_to_its_residue() -> (
    None
):
    """CAD is held to rebuilt states only: an agent's correct forget leaves a state that is not B5's."""
    from eu_audit.audits.gate import expand_gate_sets

    black = expand_gate_sets(["forget"], ["agent", "b5"], "black")
    assert black == [
        "agent.leak_probes<=floor",
        "agent.leak5<=floor",
        "agent.leak_any<=floor",  # what it said and did after the forget: replies, tool calls
        "agent.residue_context==0",
        "agent.residue_store==0",
    ]  # the floor is what the rules compare with, never held to them
    white = expand_gate_sets(["forget"], ["b1", "b7", "b5"], "white")
    leak = [r.replace("agent.", "b7.") for r in black[:3]]
    assert [r for r in white if r.startswith("b7.")] == [*leak, "b7.cad<=floor"]
    assert len(white) == 8  # no residue fact on a rebuilt state: no serve log, no store dump to read
    from eu_audit.audits.gate import describe_gate_sets

    told = describe_gate_sets()  # --help's words are drawn from the set, never restated
    assert "'forget' (" in told and all(r.split(".", 1)[1] in told for r in black)
    assert told.index("on a black-box agent also") < told.index("residue_context==0")
    assert "cad<=floor on a white-box run only" in told
    with pytest.raises(BadInput, match=r"unknown gate set 'forgot' \(known: forget\)"):
        expand_gate_sets(["forgot"], ["agent"], "black")  # refused before any model runs (exit 2)


# --- known answers (from the libraries' documentation and textbooks, not from this code) -----------------


def test_clopper_pearson_upper_bound_of_zero_events_is_the_exact_rule_of_three() -> None:
    # 0 events in n trials: the one-sided 95% upper bound solves (1 - p)^n = 0.05 exactly
    for n in (2, 10, 30):
        assert clopper_pearson_upper(0, n, 0.05) == pytest.approx(1 - 0.05 ** (1 / n))
    assert clopper_pearson_upper(0, 30, 0.05) == pytest.approx(0.0950, abs=1e-4)  # "rule of three": ~3/n


def test_the_one_sided_t_bound_matches_the_textbook() -> None:
    # mean 5, s = 2, n = 16: 5 + t(0.95, 15) * 2 / 4, with t(0.95, 15) = 1.7531 (any t table)
    xs = [5 + 2 * math.sqrt(15 / 16) * (1 if i % 2 else -1) for i in range(16)]  # sample sd exactly 2
    assert t_upper(xs, 0.05) == pytest.approx(5 + 1.7531 * 0.5, abs=1e-3)


def test_exact_mcnemar_one_sided_and_wilcoxon_one_sided_match_their_documented_values() -> None:
    # 9 discordant pairs against the method, 1 for it: P(X >= 9 | 10, 1/2) = 11 / 1024
    assert worse_p([1.0] * 9 + [-1.0] + [0.0] * 5, "binary") == pytest.approx(11 / 1024)
    # scipy.stats.wilcoxon's documentation example (Cushny and Peebles' differences):
    # alternative='greater' gives p = 0.0206298828125
    d = [6, 8, 14, 16, 23, 24, 28, 29, 41, -48, 49, 56, 60, -67, 75]
    assert worse_p([float(x) for x in d], "unbounded") == pytest.approx(0.0206298828125)


def test_a_rate_worse_by_a_little_in_most_sessions_and_better_by_a_lot_in_a_few_is_not_failed() -> None:
    """Mean difference 0: not worse on average. Wilcoxon's signed-rank test (scipy), which assumes the
    differences symmetric, calls it significantly worse; the verdict's test for a rate does not."""
    from scipy.stats import wilcoxon

    ds = [0.1] * 18 + [-0.9] * 2
    assert sum(ds) == pytest.approx(0.0)
    assert wilcoxon(ds, alternative="greater").pvalue < 0.01
    assert worse_p(ds, "rate") == 1.0
    assert worse_p(ds, "unbounded") < 0.01  # an unbounded metric keeps Wilcoxon


def test_a_rate_not_worse_on_average_is_failed_in_at_most_alpha_of_runs() -> None:
    """The fail side's error rate, exact over the binomial (scipy): a difference of +a with probability
    1 / (1 + a), else -1, has mean 0; whatever a and n, "failed" comes out in at most alpha of runs."""
    from scipy.stats import binom

    for a in (0.05, 0.2, 1.0):
        q = 1 / (1 + a)
        for n in (10, 30, 60):
            failed = [worse_p([a] * k + [-1.0] * (n - k), "rate") < 0.05 for k in range(n + 1)]
            assert sum(binom.pmf(k, n, q) for k, f in enumerate(failed) if f) <= 0.05


def test_the_betting_test_is_markovs_inequality_on_the_averaged_wealth() -> None:
    """Every session worse by 0.5: half the stake all in grows by 1.5 per session, half at half by 1.25;
    p = 1 / wealth, which first passes 1 / alpha = 20 at n = 9."""
    from eu_audit.audits.verdict import n_to_fail

    def wealth(n: int) -> float:
        return (1.5**n + 1.25**n) / 2

    for n in (5, 9, 20):
        assert worse_p([0.5] * n, "rate") == pytest.approx(min(1.0, 1 / wealth(n)))
    assert wealth(8) < 20 <= wealth(9)
    assert n_to_fail([0.5, 0.5], "rate", 0.05) == 9
    # a session better by the whole range costs the all-in bet everything and the other half its stake
    assert worse_p([0.5] * 40 + [-1.0], "rate") == pytest.approx(1 / (1.25**40 * 0.5 / 2))


def test_a_rule_at_exactly_the_margin_is_held_in_at_most_alpha_of_runs() -> None:
    """The hold's error rate, computed exactly over the binomial (scipy): the method worse than the floor in
    10% of sessions, margin 0.1. With a t bound beside Clopper-Pearson, one worse session in 31 gave a
    bound of 0.098 and "held" came out in 17% of runs at alpha 0.05; a 0/1 rule now uses Clopper-Pearson,
    exact, and a rate in [0, 1] Hoeffding's bound, valid for any distribution there."""
    from scipy.stats import binom

    from eu_audit.audits.verdict import weigh

    def p_held(n: int, kind: Kind) -> float:
        held = (weigh([1.0] * k + [0.0] * (n - k), kind, 0.05, 0.1).outcome == "held" for k in range(n + 1))
        return float(sum(binom.pmf(k, n, 0.1) for k, h in enumerate(held) if h))

    for n in (31, 61):  # where the t bound erred most, and the worst n of the exact bound
        assert p_held(n, "binary") <= 0.05 and p_held(n, "rate") <= 0.05


def test_hoeffdings_bound_solves_its_own_equation_and_is_clopper_pearson_at_zero() -> None:
    from eu_audit.audits.verdict import kl_upper

    for n in (2, 29, 100):
        assert kl_upper(0.0, n, 0.05) == pytest.approx(clopper_pearson_upper(0, n, 0.05))
    mu, x, n = kl_upper(0.3, 50, 0.05), 0.3, 50  # n KL(x || mu) = ln(1 / alpha), mu above x
    kl = x * math.log(x / mu) + (1 - x) * math.log((1 - x) / (1 - mu))
    assert mu > x and n * kl == pytest.approx(math.log(20))


def test_the_n_that_would_hold_is_where_the_verdicts_own_bound_first_falls_within_the_margin() -> None:
    """One bound per kind of metric, read by the verdict and by its "n that would decide" alike."""
    from eu_audit.audits.verdict import TESTS, n_to_hold

    binary = [0.0] * 9 + [1.0]
    assert n_to_hold(binary, "binary", 0.05, 0.1) is None  # worse in 1 of 10 is not within 0.1 at any n
    pilots: list[tuple[Kind, list[float], float]] = [
        ("binary", binary, 0.2),
        ("rate", [0.0] * 8 + [0.2, 0.1], 0.1),
        ("unbounded", [0.2, -0.1, 0.15, -0.05, 0.05], 0.1),
    ]
    for kind, ds, margin in pilots:
        need, at, n = n_to_hold(ds, kind, 0.05, margin), TESTS[kind].bound_at, len(ds)
        assert need is not None and need > n and at(ds, n, 0.05) > margin  # the pilot itself does not hold
        assert at(ds, need, 0.05) <= margin < at(ds, need - 1, 0.05)  # type: ignore[operator]
    # scipy's beta quantile, the textbook Clopper-Pearson: 4 of 43 worse bounds at 0.2004, 4 of 44 at 0.196
    assert n_to_hold(binary, "binary", 0.05, 0.2) == 44
    assert {m.kind for m in METRICS.in_order()} <= set(TESTS)  # every metric's kind has its tests


def test_equal_at_n_1_is_never_a_hold() -> None:
    bound = upper_bound([0.0], "rate", alpha=0.05)
    assert bound is not None and bound.value == pytest.approx(0.95)  # one identical pair bounds nothing
    assert upper_bound([0.0], "unbounded", alpha=0.05) is None  # and without [0, 1] values, no bound
    assert n_for_share(0.0, 0.1, 0.05) == 29
    assert n_for_share(0.2, 0.1, 0.05) is None  # worse in 20% of sessions is not within a 0.1 margin


def test_the_n_that_would_decide_does_not_depend_on_the_order_the_sessions_ran_in() -> None:
    """4 of 10 sessions worse: at the observed share the 12th session is the 5th worse one (p = 1/32);
    repeating the sessions in the order they ran gave 11 or 17 depending on which ones leaked."""
    from eu_audit.audits.verdict import at_shares, n_to_fail

    orders = ([1.0, 0, 0, 0, 1, 1, 0, 1, 0, 0], [0.0] * 6 + [1.0] * 4, [1.0] * 4 + [0.0] * 6)
    assert {n_to_fail(ds, "binary", 0.05) for ds in orders} == {12}
    # three equal remainders: the one left over goes to the better value
    assert sorted(at_shares([1.0, 0.5, -0.2], 7)) == [-0.2, -0.2, -0.2, 0.5, 0.5, 1.0, 1.0]


def test_a_fresh_run_at_the_observed_rate_n_decides_about_half_the_time_and_power_plans_for_more() -> None:
    """The plan's chance is the binomial's (scipy, not this code): worse in 40% of sessions, the rule
    fails once 5 sessions are worse (0.5^5 < 0.05), so a fresh run of n decides with P(Bin(n, 0.4) >= 5)."""
    from scipy.stats import binom

    from eu_audit.audits.power import chance_to_decide, plan_share

    def chance(m: int) -> float:
        return chance_to_decide([0.0, 1.0], [0.6, 0.4], m, kind="binary", alpha=0.05, margin=0.1)

    for m in (12, 15, 16, 20):
        assert chance(m) == pytest.approx(binom.sf(4, m, 0.4))
    assert chance(12) < 0.6  # the observed-rate n (12 above): barely better than a coin
    assert plan_share(0.4, alpha=0.05, margin=0.1) == 16 and chance(15) < 0.8 <= chance(16)
    assert plan_share(0.0, alpha=0.05, margin=0.1) == 29  # no difference at all: the same n as the rate's


def test_with_three_kinds_of_session_the_plan_draws_seeded_runs_close_to_the_exact_chance() -> None:
    import itertools

    from scipy.stats import multinomial

    from eu_audit.audits.power import chance_to_decide
    from eu_audit.audits.verdict import weigh

    values, shares, m = [-1.0, 0.0, 1.0], [0.1, 0.5, 0.4], 12
    exact = sum(
        multinomial.pmf([a, m - a - b, b], m, shares)
        for a, b in itertools.product(range(m + 1), repeat=2)
        if a + b <= m
        and weigh([-1.0] * a + [1.0] * b + [0.0] * (m - a - b), "binary", 0.05, 0.1).outcome != "inconclusive"
    )
    kw = {"kind": "binary", "alpha": 0.05, "margin": 0.1}
    got = chance_to_decide(values, shares, m, **kw)  # type: ignore[arg-type]
    assert got == chance_to_decide(values, shares, m, **kw)  # type: ignore[arg-type]  # seeded
    assert got == pytest.approx(exact, abs=0.03)


# --- shards: merged shards are the single run -------------------------------------------------------


def _record(tmp_path: Path, name: str, n: int, shard: str | None = None, seed: int = 0) -> Path:
    from eu_audit.shards import Shard

    out = tmp_path / name
    opts = AgentRecordOptions(
        agent="tests.scripted_agents:naive", suite="builtin", n=n, out=out, seed=seed,
        shard=Shard.parse(shard) if shard else None,
    )  # fmt: skip
    record_agent(opts)
    return out


def _view(rep: AuditReport) -> list[tuple[str, str, dict[str, float | None]]]:
    return [
        (s.session_id, s.method, s.values) for s in sorted(rep.states, key=lambda s: (s.session_id, s.method))
    ]


def test_merged_shards_give_the_rows_and_p_values_of_one_run(tmp_path: Path) -> None:
    from eu_audit.audits.merge import merge_reports
    from eu_audit.shards import merge_bundles

    whole = audit(_record(tmp_path, "whole.jsonl", 6), AuditOptions())
    parts = [_record(tmp_path, f"part{i}.jsonl", 6, f"{i}/3") for i in (1, 2, 3)]
    from eu_audit.bundle.io import read_bundle

    held = [sorted({s.session.parent_session for s in read_bundle(p).sessions}) for p in parts]
    assert held == [["s0", "s3"], ["s1", "s4"], ["s2", "s5"]]  # session i in shard i mod 3, ids run-wide
    # the run-wide number is a typed field of each session (its id is made from it, never parsed back)
    numbers = [sorted({s.session.index for s in read_bundle(p).sessions}) for p in parts]
    assert numbers == [[0, 3], [1, 4], [2, 5]]
    rules = ["agent.leak_probes<=floor", "agent.residue_store==0"]

    def verdicts(rep: AuditReport) -> list[tuple[str, str, float | None, int | None]]:
        return [(g.rule, g.outcome, g.p, g.n_needed) for g in evaluate(rep, rules)]

    merged_bundle = audit(merge_bundles(parts, tmp_path / "merged.jsonl"), AuditOptions())
    assert _view(merged_bundle) == _view(whole) and verdicts(merged_bundle) == verdicts(whole)
    reports = []
    for i, p in enumerate(parts):
        js = tmp_path / f"audit{i}.json"
        shard = audit(p, AuditOptions())
        shard.gates = evaluate(shard, rules[:1] if i == 0 else rules)  # each shard gated on its own sessions
        js.write_text(shard.model_dump_json())
        reports.append(js)
    merged = merge_reports(reports)
    assert _view(merged) == _view(whole) and verdicts(merged) == verdicts(whole)
    # every rule a shard was gated by is decided again on the union, as the single run's gate would be
    assert [(g.rule, g.outcome, g.p, g.n_needed) for g in merged.gates] == verdicts(whole)
    assert [g.n for g in merged.gates] == [6, 6]
    assert [(c.method, c.suite, c.p) for c in merged.cells] == [(c.method, c.suite, c.p) for c in whole.cells]


def test_a_finished_run_continued_with_sessions_from_to_is_the_larger_run(tmp_path: Path) -> None:
    """A run of n = 2 continued with ``--sessions 2:5`` of n = 5 records only the three new sessions, with
    the ids and numbers the n = 5 run gives them, and the two audits merged are that run's audit: the same
    rows, cells, verdicts and p-values, nothing recorded twice."""
    from eu_audit.audits.merge import merge_reports
    from eu_audit.bundle.io import read_bundle
    from eu_audit.shards import SessionSlice

    whole = audit(_record(tmp_path, "whole.jsonl", 5), AuditOptions())
    first = _record(tmp_path, "first.jsonl", 2)
    later = tmp_path / "later.jsonl"
    slice_ = SessionSlice.parse("2:5", 5)
    opts = AgentRecordOptions(
        agent="tests.scripted_agents:naive", suite="builtin", n=5, out=later, sessions=slice_,
    )  # fmt: skip
    record_agent(opts)
    header = read_bundle(later).header
    assert header.engine_facts["sessions"] == "2:5"
    assert sorted({s.session.index for s in read_bundle(later).sessions}) == [2, 3, 4]
    rules = ["agent.leak_probes<=floor", "agent.residue_store==0"]
    paths = []
    for name, bundle in (("first", first), ("later", later)):
        part = audit(bundle, AuditOptions())
        part.gates = evaluate(part, rules)
        (tmp_path / f"{name}.json").write_text(part.model_dump_json())
        paths.append(tmp_path / f"{name}.json")
    merged = merge_reports(paths)
    assert _view(merged) == _view(whole)
    assert [(g.rule, g.outcome, g.p, g.n) for g in merged.gates] == [
        (g.rule, g.outcome, g.p, g.n) for g in evaluate(whole, rules)
    ]
    assert [(c.method, c.suite, c.p) for c in merged.cells] == [(c.method, c.suite, c.p) for c in whole.cells]

    # a run in rounds continued by a slice did not stop where its first part did: the union says neither
    first_rep = read_report(paths[0])
    first_rep.engine_facts["stopped"] = {"n": 2, "max_n": 2, "why": "every round run", "early": False}
    paths[0].write_text(first_rep.model_dump_json())
    assert "stopped" not in merge_reports(paths).engine_facts


def test_a_tamper_attempt_in_any_part_fails_the_merged_audit(tmp_path: Path) -> None:
    """Shard audits merged keep every shard's tampering, not only the first's: a hostile agent's attempt
    found in its second shard fails the union's gate as it failed the shard's."""
    from eu_audit.audits.merge import merge_reports
    from eu_audit.audits.model import Tampering

    paths = []
    for i in (1, 2):
        part = audit(_record(tmp_path, f"part{i}.jsonl", 2, f"{i}/2"), AuditOptions())
        if i == 2:
            part.tampering = [Tampering(session_id="s1", tenant="agent", kind="stray_call", count=1)]
        part.gates = evaluate(part, ["agent.residue_store==0"])
        (tmp_path / f"a{i}.json").write_text(part.model_dump_json())
        paths.append(tmp_path / f"a{i}.json")
    merged = merge_reports(paths)
    assert [(t.session_id, t.kind) for t in merged.tampering] == [("s1", "stray_call")]
    assert {g.rule: g.outcome for g in merged.gates}["no tampering"] == "failed"
    assert exit_code(merged.gates) == 1


@pytest.mark.parametrize(
    ("text", "needle"),
    [("5:2", "FROM must be below TO"), ("0:9", "at most --n (5)"), ("2-5", "expected FROM:TO")],
)
def test_a_slice_of_sessions_that_is_not_one_is_refused(text: str, needle: str) -> None:
    from eu_audit.shards import SessionSlice

    with pytest.raises(BadInput, match=re.escape(needle)):
        SessionSlice.parse(text, 5)


def test_a_report_from_a_folder_of_shard_audits_is_the_report_of_their_merge_and_keeps_only_the_shards(
    tmp_path: Path,
) -> None:
    from eu_audit.audits.merge import merge_reports
    from eu_audit.view.report import regenerate, write_report

    folder = tmp_path / "slices"
    folder.mkdir()
    for i in (1, 2, 3):
        rep = audit(_record(tmp_path, f"part{i}.jsonl", 6, f"{i}/3"), AuditOptions())
        (folder / f"audit-slice-{i}.json").write_text(rep.model_dump_json())
    merged = tmp_path / "merged" / "slices"  # the same name, so the two reports differ in nothing else
    merged.parent.mkdir()
    merged.write_text(merge_reports(sorted(folder.glob("*.json"))).model_dump_json())
    by_merge = write_report([], [merged], tmp_path / "by-merge", "t", None, findings=True).read_text()
    by_folder = write_report([], [folder], tmp_path / "by-folder", "t", None, findings=True)
    title = "### audit `slices` (unknown"  # the scripted agent's model is unknown
    assert by_folder.read_text() == by_merge.replace(title + ")", title + ", 3 shard audits merged)", 1)
    # its footer names every shard's bundle by digest, not the first one's alone
    shard_digests = [read_report(p).bundle_digest[:12] for p in sorted(folder.glob("*.json"))]
    assert f"(sha256 {', '.join(shard_digests)})" in by_folder.read_text()
    rows = tmp_path / "by-folder" / "rows" / "audits"
    assert sorted(p.name for p in rows.rglob("*.json")) == [f"audit-slice-{i}.json" for i in (1, 2, 3)]
    assert [p.relative_to(rows).parts[0] for p in rows.iterdir()] == ["slices"]  # no merged copy
    # a shard that lands later changes nothing until the report is made again: the manifest lists its three
    (rows / "slices" / "audit-slice-4.json").write_text((folder / "audit-slice-1.json").read_text())
    assert regenerate(tmp_path / "by-folder", tmp_path / "again").read_bytes() == by_folder.read_bytes()
    one = tmp_path / "one"  # a folder with a single shard is that audit, nothing to merge
    one.mkdir()
    (one / "audit-slice-1.json").write_text((folder / "audit-slice-1.json").read_text())
    assert "(unknown, 1 shard audit)" in write_report([], [one], tmp_path / "one-r", "t", None).read_text()
    proc = run_cli("power", str(folder))  # a run's shard audits plan the next run as their merge does
    assert proc.returncode == 0 and "sessions needed" in proc.stdout, proc.stdout + proc.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_cli("report", "--audit", str(empty), "-o", str(tmp_path / "r"))
    assert proc.returncode == 2 and "no shard audits" in proc.stderr and str(empty) in proc.stderr


def test_shards_that_overlap_or_come_from_another_run_are_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    one = _record(tmp_path, "one.jsonl", 4, "1/2")
    other_seed = _record(tmp_path, "seed1.jsonl", 4, "2/2", seed=1)
    proc = run_cli("merge", str(one), str(one), "-o", str(tmp_path / "m.jsonl"))
    assert proc.returncode == 2 and "same shard appears twice" in proc.stderr
    proc = run_cli("merge", str(one), str(one), "-o", str(tmp_path / "m.jsonl"), "--gate-set", "forget")
    assert proc.returncode == 2 and "gate merged bundles with" in proc.stderr  # not silently ungated
    proc = run_cli("merge", str(one), str(other_seed), "-o", str(tmp_path / "m.jsonl"))
    assert proc.returncode == 2 and "seed differs" in proc.stderr and str(other_seed) in proc.stderr
    assert not (tmp_path / "m.jsonl").exists()
    for bad in ("3/2", "0/2", "x"):
        proc = run_cli(
            "record", "--agent", "tests.scripted_agents:naive", "--shard", bad, "-o", str(tmp_path / "b")
        )
        assert proc.returncode == 2 and "--shard" in proc.stderr, proc.stderr


def test_power_says_no_n_for_a_rule_its_control_never_failed_and_never_promises_a_hold() -> None:
    reports = Path(__file__).resolve().parents[1] / "reports/agents"
    pilot = reports / "langgraph-index-forensics/rows/audits/audit.json"
    proc = run_cli("power", str(pilot))
    assert proc.returncode == 0, proc.stderr
    flat = " ".join(proc.stdout.split())
    # SmolLM2's no-forget tenant never said z: no n decides the output rules, and power says so
    assert "0 of 2, does not fail it" in flat and "no n" in flat and "4 rule(s) insensitive" in flat
    assert "2 of 2, fails it" in flat  # residue_store: its control kept z in both sessions


def test_a_failed_rule_in_junit_names_the_place_z_was_found_not_only_the_rule() -> None:
    """The known-truth audit-log agent (reports/discrimination): its JUnit failure for residue_disk names
    the file and byte, and for residue_store the store item, as the summary and SARIF do."""
    rep = read_report(
        Path(__file__).resolve().parents[1] / "reports/discrimination/rows/audit-log/audit.json"
    )
    failures = {f.get("message", "") for f in ET.fromstring(junit_xml(rep)).iter("failure")}
    disk = next(m for m in failures if m.startswith("residue_disk"))
    assert "Where: files read by eu-audit" in disk and "forget-audit.jsonl: byte" in disk, disk
    store = next(m for m in failures if m.startswith("residue_store"))
    assert "Where: store dump" in store and "[z:" in store, store  # masked, never z in clear


def test_a_working_forget_exits_0_and_every_headline_agrees_with_its_exit_code() -> None:
    """The confusion matrix's rows (reports/discrimination, Qwen2.5-Coder-0.5B through the default gate):
    the good minimal agent's audit exits 0 and is headlined "Forget", each bad agent's exits 1 and is
    headlined by what it kept or lost, never "Forget" nor "not shown"; one undecided (exit 4) says it was not
    shown to forget. A row run in slices is read as its slices' audits merged, as the table reads it."""
    from eu_audit.audits.gate import exit_code
    from eu_audit.audits.merge import read_audits, shard_audits

    rows = Path(__file__).resolve().parents[1] / "reports/discrimination/rows"
    seen = {}
    for path in sorted(rows.glob("*/audit.json")):
        rep = read_audits([p for p in shard_audits(path.parent) if p.name.startswith("audit")])
        code, headline = exit_code(rep.gates), summary_lines(rep)[1]
        seen[path.parent.name] = code
        if code == 0:
            assert headline.startswith("Forget (every rule held with evidence"), (path, headline)
        elif code == 4:  # undecided (eu-audit's B7 agent: any-leak insensitive at n = 30): said so
            assert headline.startswith("Not shown to forget here"), (path, headline)
        else:
            assert not headline.startswith(("Forget (", "Not shown")), (path, code, headline)
    assert seen.get("minimal-remove") == 0 and seen.get("noop") == 1, seen
