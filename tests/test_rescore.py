"""``eu-audit rescore``: an audit's texts decided again by today's matcher, from its rows alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eu_audit.audits.model import AuditReport, read_report
from eu_audit.audits.rescore import rescore, suite_targets
from eu_audit.errors import BadInput

ROWS = Path(__file__).parent.parent / "reports" / "audit-smollm2" / "rows" / "audits" / "smol10.audit.json"


def _bfcl_memory() -> AuditReport:
    """The committed SmolLM2 audit's bfcl-memory sessions (10 of 40, every method): the suite where B0
    says z, small enough that re-masking every text with every target takes a second, not twenty."""
    rep = read_report(ROWS)
    return rep.model_copy(
        update={"suites": ["bfcl-memory"], "states": [s for s in rep.states if s.suite == "bfcl-memory"]}
    )


def _targets(rep: AuditReport) -> dict:
    out: dict = {}
    for suite in rep.suites:
        out.update(suite_targets(suite))
    return out


def _report_with_a_missed_leak() -> tuple[AuditReport, str, str]:
    """The committed SmolLM2 audit with one B0 bfcl-memory probe answer rewritten to hold z in clear,
    still scored not leaked: what an older matcher that missed the spelling left."""
    rep = _bfcl_memory()
    st = next(
        s
        for s in rep.states
        if s.method == "b0" and s.suite == "bfcl-memory" and not any(o.leaked for o in s.probes)
    )
    target = suite_targets("bfcl-memory")[st.episode_id]
    st.probes[0].text = f"Sure: THE {target.value.upper()}."
    st.probes[0].leaked = False
    return rep, st.session_id, target.value


def test_a_text_the_old_matcher_missed_counts_and_is_masked_and_the_cells_follow() -> None:
    rep, session, value = _report_with_a_missed_leak()
    cell = rep.cell("b0", "bfcl-memory")
    assert cell is not None
    before = cell.values["leak_probes"]
    new, counts = rescore(rep, _targets(rep), rescored_by="abc")
    st = next(s for s in new.states if s.session_id == session and s.method == "b0")
    assert st.probes[0].leaked and value.upper() not in st.probes[0].text and "[z:" in st.probes[0].text
    assert counts.probes[("b0", "bfcl-memory")] == 1 and counts.masked == 1
    after = new.cell("b0", "bfcl-memory")
    assert after is not None and after.values["leak_probes"] == pytest.approx(before + 1 / after.n)
    assert new.rescored_by == "abc"


def test_a_text_the_audit_counted_stays_counted_and_nothing_else_moves() -> None:
    """The committed rows re-scored by the matcher they were masked with: no verdict changes."""
    rep = _bfcl_memory()
    new, counts = rescore(rep, _targets(rep))
    assert not counts.changed
    assert [o.leaked for s in new.states for o in s.probes] == [
        o.leaked for s in rep.states for o in s.probes
    ]
    assert [c.values for c in new.cells if c.suite == "bfcl-memory"] == [
        c.values for c in rep.cells if c.suite == "bfcl-memory"
    ]


def test_a_state_whose_episode_no_suite_given_holds_is_bad_input_not_a_guess() -> None:
    rep = _bfcl_memory()
    with pytest.raises(BadInput, match="its target is unknown"):
        rescore(rep, suite_targets("preference"), source=str(ROWS))


def test_rescore_never_writes_over_its_input(tmp_path: Path) -> None:
    from .helpers import run_cli

    audit = tmp_path / "a.json"
    audit.write_text(_bfcl_memory().model_dump_json())
    r = run_cli("rescore", str(audit), "-o", str(audit), "--force")
    assert r.returncode == 2 and "never overwrites an input" in r.stderr
    assert audit.read_text() == _bfcl_memory().model_dump_json()
    out = tmp_path / "b.json"
    r = run_cli("rescore", str(audit), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "no text changed its verdict" in r.stdout
    assert json.loads(out.read_text())["rescored_by"]
    assert out.stat().st_mode & 0o777 == 0o600
