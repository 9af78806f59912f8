"""tools/where.py: the reports' account of where z survived names who made each call that carried it.

A prompt tier names a message's role only: a memory library's extraction prompt, which renders the last
messages as text inside one user turn, lands in "history: user turns" beside the agent's own history. The
helper reads serve's log to tell them apart by the call's system prompt.
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

WHERE = Path(__file__).resolve().parents[1] / "tools" / "where.py"
Z = "Kastanienallee 7"


def _call(seq: int, phase: str, system: str, user: str) -> dict[str, object]:
    return {
        "seq": seq,
        "time": 1_700_000_000.0 + seq,
        "mark": {"tenant": "5f0c9a1e", "phase": phase},
        "endpoint": "/v1/chat/completions",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }


def _run_folder(tmp_path: Path) -> Path:
    records = [
        {
            "type": "session",
            "session_id": "s0/agent",
            "tenant": "5f0c9a1e",
            "episode": {"target": {"value": Z, "variants": []}},
        },
        {"type": "agent_forget", "session_id": "s0/agent", "detail": "deleted 1 memories"},
        {
            "type": "residue",
            "session_id": "s0/agent",
            "after": None,
            "context_calls": 3,
            "context_calls_with_z": 2,
            "context_tiers": {"user": 2},
            "context_example": "[history: user turns] user: I live at [z]",
            "store_items": 4,
            "store_items_with_z": 0,
            "store_tiers": {},
            "store_example": "",
        },
    ]
    log = [
        _call(0, "stream", "# ROLE You extract memories", f"user: I live at {Z}"),  # before the forget
        _call(1, "future", "# ROLE You extract memories", f"## Last k Messages\nuser: I live at {Z}"),
        _call(2, "future", "# ROLE You extract memories", f"## Last k Messages\nuser: I live at {Z}"),
        _call(3, "future", "You are a personal assistant", "Book a taxi"),  # clean
    ]
    run = {"agent": "x", "forget": "x", "suite": "builtin", "n": 1, "k": 5, "gate_exit": 1}
    (tmp_path / "run.json").write_text(json.dumps(run | {"record_s": 1, "audit_s": 1}))
    (tmp_path / "bundle.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    (tmp_path / "serve.jsonl").write_text("\n".join(json.dumps(e) for e in log) + "\n")
    return tmp_path


def test_the_calls_that_carried_z_after_the_forget_are_named_by_their_system_prompt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    where = runpy.run_path(str(WHERE))
    where["main"]([str(_run_folder(tmp_path))])
    out = capsys.readouterr().out
    # two extraction calls after the forget carried z; the one before it and the clean one are not counted
    assert 'by their system prompt\'s opening: "# ROLE You extract memories" 2' in out
    assert "personal assistant" not in out


def test_without_a_serve_log_the_account_still_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _run_folder(tmp_path)
    (folder / "serve.jsonl").unlink()
    runpy.run_path(str(WHERE))["main"]([str(folder)])
    out = capsys.readouterr().out
    assert "z reached 2 of 3 model calls after the forget" in out
    assert "system prompt's opening" not in out
