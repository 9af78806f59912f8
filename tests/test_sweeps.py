"""Sweeps and reports: the fit on a constructed case, resume gives the same rows, report files."""

from __future__ import annotations

from pathlib import Path

import pytest

from eu_audit.errors import BadInput
from eu_audit.models import LoadedModel
from eu_audit.sweeps import SweepOptions, fit_line, load_rows, run_sweep
from eu_audit.view.report import regenerate, write_report


def test_fit_recovers_an_exact_line_and_reports_a_flat_one_as_flat() -> None:
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]
    fit = fit_line(xs, [30.0 + 70.0 * x for x in xs])
    assert (fit.slope, fit.intercept, fit.r2, fit.n) == (
        pytest.approx(70.0),
        pytest.approx(30.0),
        pytest.approx(1.0),
        5,
    )
    noisy = fit_line(xs, [10.0, 31.0, 29.0, 52.0, 48.0])
    # by hand: Sxy = 97, Sxx = 10 -> slope 9.7; intercept 34 - 3 * 9.7 = 4.9
    assert (
        noisy.slope == pytest.approx(9.7) and noisy.intercept == pytest.approx(4.9) and 0.8 < noisy.r2 < 1.0
    )
    assert fit_line(xs, [7.0] * 5).slope == 0.0
    with pytest.raises(ValueError):
        fit_line([1.0, 1.0], [2.0, 3.0])


def _opts(out: Path, values: list[str]) -> SweepOptions:
    return SweepOptions(
        name="depth",
        out=out,
        model="tiny-random",
        n=1,
        turns_after=3,
        max_tokens=6,
        values=values,
        command="eu-audit sweep depth (test)",
    )


def _key(rows):  # type: ignore[no-untyped-def]
    return [r.model_dump(exclude={"wall_s"}) for r in rows]


def test_a_resumed_sweep_gives_the_same_rows_as_an_uninterrupted_one(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    whole = run_sweep(_opts(tmp_path / "whole", ["0", "1"]), loaded=tiny)
    run_sweep(_opts(tmp_path / "resumed", ["0"]), loaded=tiny)  # interrupted after the first value
    first = (tmp_path / "resumed" / "rows.jsonl").read_bytes()
    resumed = run_sweep(_opts(tmp_path / "resumed", ["0", "1"]), loaded=tiny)
    assert _key(resumed) == _key(whole)
    assert (tmp_path / "resumed" / "rows.jsonl").read_bytes().startswith(first)  # value 0 was not re-run
    assert _key(load_rows(tmp_path / "resumed")) == _key(whole)
    assert {r.method for r in whole} == {"b3", "b7", "b5"}
    assert all(r.cad == 0.0 for r in whole if r.method in ("b5", "b7"))
    report = write_report([tmp_path / "whole"], [], tmp_path / "report", "test report", None)
    text = report.read_text()
    assert "sweep `depth`" in text and "eu-audit sweep depth (test)" in text and "Paper:" in text
    assert (tmp_path / "report" / "sweep-whole.png").stat().st_size > 1000  # named after the folder
    assert regenerate(tmp_path / "report", tmp_path / "again").read_bytes() == report.read_bytes()


def test_a_sweep_folder_is_never_mixed_with_another(tiny: LoadedModel, tmp_path: Path) -> None:
    run_sweep(_opts(tmp_path / "s", ["0"]), loaded=tiny)
    other = _opts(tmp_path / "s", ["0"])
    other.seed = 5
    with pytest.raises(BadInput, match="different sweep"):
        run_sweep(other, loaded=tiny)
    with pytest.raises(BadInput, match="no value"):
        run_sweep(_opts(tmp_path / "t", ["9"]), loaded=tiny)


def test_cost_sweeps_run_without_a_compaction_so_only_their_knob_moves_the_cost() -> None:
    from eu_audit.suites.compose import Knobs
    from eu_audit.sweeps import SWEEPS
    from eu_audit.sweeps.specs import NO_COMPACTION_DEPTH

    base = Knobs(turns_after=4)
    for name in ("tau", "granularity", "position"):
        spec = SWEEPS.get(name)
        assert all(spec.knobs(v, base).depth <= NO_COMPACTION_DEPTH for v in spec.values), name
    assert {SWEEPS.get("depth").knobs(v, base).depth for v in SWEEPS.get("depth").values} == {0, 1, 2, 3}


def test_a_coarser_checkpoint_policy_changes_the_reused_prefix_not_the_result(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    opts = _opts(tmp_path / "g", ["every_turn", "semantic", "session_start"])
    opts.name = "granularity"
    rows = run_sweep(opts, loaded=tiny)
    b7 = {r.value: r for r in rows if r.method == "b7"}
    assert b7["every_turn"].reused > b7["session_start"].reused  # the finer policy keeps more prefix
    assert b7["every_turn"].checkpoint_bytes > b7["semantic"].checkpoint_bytes > 0
    assert {(r.leak_any, r.cad, r.transitions) for r in b7.values()} == {
        (False, 0.0, b7["semantic"].transitions)
    }
