"""The default model (Qwen2.5-Coder-0.5B) on the built-in suite: the target flows into derived state.

Opt in with ``pytest -m slow`` (about 3 minutes on 2 cores)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eu_audit.bundle.io import read_bundle
from eu_audit.record import RecordOptions, record
from eu_audit.trace.blocks import BlockType


@pytest.mark.slow
def test_on_the_default_model_the_target_reaches_answers_plans_and_summaries(tmp_path: Path) -> None:
    out = tmp_path / "q.jsonl"
    record(RecordOptions(model="qwen2.5-coder-0.5b", out=out))
    bundle = read_bundle(out)
    reached: set[BlockType] = set()
    for s in bundle.sessions:
        derived = [b for b in s.target_occurrences() if b.derived]
        assert derived, f"{s.session_id}: the target never reached a derived artifact"
        closure = s.graph().taint_closure(s.session.source_id)
        assert {b.id for b in derived} <= closure  # provenance saw every place it went
        reached |= {b.type for b in derived}
    assert {BlockType.assistant, BlockType.summary} <= reached
    assert BlockType.plan in reached or BlockType.tool_call in reached
