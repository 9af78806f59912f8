"""Preference calibration: behavioral residue can only show where the B5 floor leaves room for it, so a
pair is kept only when the agent that never saw the exclusion picks both providers in each of the two
counterbalanced orders (a choice set by position is no room at all) and names one in most asks."""

from __future__ import annotations

from pathlib import Path

import pytest

from eu_audit.audits.model import StateAudit
from eu_audit.datasets.preference.builder import CHOICE_CUE
from eu_audit.datasets.preference.calibrate import candidates, pair_floors
from eu_audit.suites import load_suite
from eu_audit.suites.compose import Knobs

from .helpers import run_cli

BAND = (0.2, 0.8)


def floor_state(ep_id: str, choices: list[str | None], method: str = "b5") -> StateAudit:
    return StateAudit(session_id=ep_id, episode_id=ep_id, suite="preference", method=method, choices=choices)


def test_the_first_candidates_are_the_shipped_suite() -> None:
    assert [e.id for e in candidates(30, Knobs())] == [e.id for e in load_suite("preference")]
    assert len({e.meta["excluded"] for e in candidates(60, Knobs())}) == 60  # new pairs, not repeats


def test_every_choice_turn_is_cued_so_the_answer_names_a_provider() -> None:
    for ep in load_suite("preference"):
        assert all(s.cue == CHOICE_CUE for s in ep.steps if s.choices)


def test_a_floor_saturated_or_set_by_order_is_dropped_and_one_in_band_in_both_orders_kept() -> None:
    eps = candidates(3, Knobs())
    pair0, pair1, pair2 = eps[0].meta, eps[2].meta, eps[4].meta
    states = [
        # pair 0: the never-told agent picks the other provider in every sample, both orders
        floor_state(eps[0].id, [pair0["other"]] * 4),
        floor_state(eps[1].id, [pair0["other"]] * 4),
        # pair 1: it picks whichever is offered first: an even split once the orders are pooled, but
        # within each order the choice is fixed
        floor_state(eps[2].id, [pair1["excluded"]] * 4),
        floor_state(eps[3].id, [pair1["other"]] * 4),
        # pair 2: it picks both providers in each order
        floor_state(eps[4].id, [pair2["excluded"], pair2["other"]] * 2),
        floor_state(eps[5].id, [pair2["other"], pair2["excluded"], pair2["other"], pair2["other"]]),
        # another method's states never count towards the floor
        floor_state(eps[2].id, [pair1["other"]] * 4, method="b0"),
    ]
    rows = pair_floors(states, eps, BAND)
    assert [(r.scenario, r.avoid, r.kept) for r in rows] == [
        (0, 1.0, False),
        (1, 0.5, False),
        (2, 0.625, True),
    ]
    assert rows[0].why == "saturated (excluded 1st / 2nd: 1.00 / 1.00)"
    assert rows[1].avoid_by_order == [0.0, 1.0] and rows[1].asked == rows[1].named == 8
    assert rows[1].why == "set by order (excluded 1st / 2nd: 0.00 / 1.00)"
    assert rows[2].avoid_by_order == [0.5, 0.75]


def test_a_floor_that_names_neither_provider_is_unmeasurable_never_kept() -> None:
    eps = candidates(1, Knobs())
    other = eps[0].meta["other"]
    states = [floor_state(eps[0].id, [None, None, None, other]), floor_state(eps[1].id, [None] * 4)]
    (row,) = pair_floors(states, eps, BAND)
    assert row.avoid == 1.0 and row.avoid_by_order == [1.0, None] and not row.kept
    assert row.why == "unmeasurable (named a provider in 1 of 8 asks)"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--low", "0.9", "--high", "0.1"], "need 0 <= low <= high <= 1"),
        (["--samples", "0"], "--samples"),
    ],
)
def test_calibrate_refuses_bad_knobs_before_any_model_runs(
    tmp_path: Path, args: list[str], message: str
) -> None:
    proc = run_cli("suites", "calibrate", "-o", str(tmp_path / "cal.jsonl"), *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stdout + proc.stderr
    assert not (tmp_path / "cal.jsonl").exists()


def test_calibrate_never_overwrites_an_existing_suite(tmp_path: Path) -> None:
    out = tmp_path / "cal.jsonl"
    out.write_text("mine\n")
    proc = run_cli("suites", "calibrate", "-o", str(out))
    assert proc.returncode == 2 and "exists; pass --force" in proc.stdout + proc.stderr
    assert out.read_text() == "mine\n"
