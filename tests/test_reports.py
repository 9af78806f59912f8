"""The committed reports carry their data: each one with rows makes itself again, byte for byte, from
them, so a change to how reports are written cannot leave a committed report that its rows no longer
give (regenerate it with ``eu-audit report --rows reports/X -o reports/X``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eu_audit.report import regenerate

REPORTS = Path(__file__).parent.parent / "reports"
WITH_ROWS = sorted(p.parent.parent for p in REPORTS.glob("**/rows/report.json"))


def test_the_reports_that_say_they_carry_rows_do() -> None:
    assert len(WITH_ROWS) >= 10  # the two sweep reports and eight of the agents' reports, at least


@pytest.mark.parametrize("folder", WITH_ROWS, ids=lambda p: str(p.relative_to(REPORTS)))
def test_a_committed_report_makes_itself_again_byte_for_byte_from_its_rows(
    folder: Path, tmp_path: Path
) -> None:
    made = regenerate(folder, tmp_path / "again")
    assert made.read_bytes() == (folder / "report.md").read_bytes()
