"""The committed reports carry their data: each one with rows makes itself again, byte for byte, from
them, so a change to how reports are written cannot leave a committed report that its rows no longer
give (regenerate it with ``eu-audit report --rows reports/X -o reports/X``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eu_audit.view.report import regenerate

REPORTS = Path(__file__).parent.parent / "reports"
WITH_ROWS = sorted(p.parent.parent for p in REPORTS.glob("**/rows/report.json"))


def test_every_committed_report_carries_the_rows_it_is_made_from() -> None:
    """reports/README.md says each report carries its inputs in rows/: every report.md under reports/ has
    a rows manifest beside it (one without fails here, naming it), so the byte-for-byte test below reads
    them all."""
    reports = sorted(p.parent for p in REPORTS.glob("**/report.md"))
    assert len(reports) >= 10
    assert [str(p.relative_to(REPORTS)) for p in reports if p not in WITH_ROWS] == []


@pytest.mark.parametrize("folder", WITH_ROWS, ids=lambda p: str(p.relative_to(REPORTS)))
def test_a_committed_report_makes_itself_again_byte_for_byte_from_its_rows(
    folder: Path, tmp_path: Path
) -> None:
    made = regenerate(folder, tmp_path / "again")
    assert made.read_bytes() == (folder / "report.md").read_bytes()


def test_a_report_from_audits_made_at_different_commits_needs_allow_mixed_and_says_so(tmp_path: Path) -> None:
    """Shards audited at two commits (an earlier one's bundle gone, so not re-auditable at one): refused
    without --allow-mixed, and with it the report names each commit and its inputs where a reader sees
    them."""
    import json

    from eu_audit.errors import BadInput
    from eu_audit.view.report import write_report

    shards = REPORTS / "agents" / "letta-n10" / "rows" / "audits" / "shards"
    audits = []
    for i, commit in ((1, "aaaaaaaaaaaa"), (2, "bbbbbbbbbbbb")):
        audit = json.loads((shards / f"audit-shard-{i}.json").read_text())
        audit["tool_commit"] = commit
        audits.append(tmp_path / f"audit-{i}.json")
        audits[-1].write_text(json.dumps(audit))
    with pytest.raises(BadInput, match="different models, engines or commits"):
        write_report([], audits, tmp_path / "strict", "t", None)
    text = write_report([], audits, tmp_path / "mixed", "t", None, allow_mixed=True).read_text()
    line = next(x for x in text.splitlines() if x.startswith("**Inputs from more than one"))
    assert "commit aaaaaaaaaaaa: audit-1.json" in line and "commit bbbbbbbbbbbb: audit-2.json" in line


def test_no_committed_audit_row_holds_a_target_the_matcher_finds() -> None:
    """Every row meant to leave the machine is masked by the matcher of today, not of its day: a spelling
    the matcher learned later (the severe penicillin allergy, an IBAN cut off at the answer's end) is
    masked in the committed rows too (``eu-audit rescore``, which masks and re-scores them)."""
    import json

    from eu_audit.blackbox.residue import strings
    from eu_audit.matching import TargetMatcher

    targets = {}
    for f in sorted((REPORTS.parent / "suites").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            e = json.loads(line)
            targets[e["id"]] = TargetMatcher.of(e["target"]["value"], e["target"].get("variants", []))

    checked, clear = 0, []
    for path in sorted(REPORTS.glob("**/*.json")):
        data = json.loads(path.read_text())
        for state in data.get("states", []) if isinstance(data, dict) else []:
            m = targets.get(state.get("episode_id", ""))
            if m is not None:
                checked += 1
                clear += [f"{path.name} {state['session_id']}" for s in strings(state) if m.found_in(s)]
    assert checked > 1000 and clear == []


def test_every_committed_audits_residue_reads_into_its_typed_record_and_writes_back_its_tiers_by_id() -> None:
    """A black-box state's residue is typed (``StateResidue``: tiers, examples, stores, the bystander, each
    recheck); every committed audit reads into it and dumps the very keys and values it was written with,
    except that an audit written before the prompt tiers had ids reads its tiers' labels as their ids
    (``history: user turns`` -> ``user``), with the same counts."""
    import json

    from eu_audit.audits.model import AuditReport
    from eu_audit.tiers import PROMPT_TIER_LABELS

    seen = relabelled = 0
    for path in sorted(REPORTS.rglob("*.json")):
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict) or "states" not in raw:
            continue
        typed = AuditReport.model_validate(raw).model_dump(mode="json")
        for before, after in zip(raw["states"], typed["states"], strict=True):
            was = dict(before.get("residue", {}))
            if "context_tiers" in was:
                labels = {label: tier for tier, label in PROMPT_TIER_LABELS.items()}
                ids = {labels.get(k, k): v for k, v in was["context_tiers"].items()}
                relabelled += ids != was["context_tiers"]
                was["context_tiers"] = ids
                assert set(ids) <= set(PROMPT_TIER_LABELS), (
                    path
                )  # every tier a committed audit counted has an id
            assert after["residue"] == was, path
            seen += bool(before.get("residue"))
    assert relabelled > 0  # the committed audits were written with labels: the old reader's path is taken
    assert seen > 100  # the agents' reports hold residue (the white-box ones none)
