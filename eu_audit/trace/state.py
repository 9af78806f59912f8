"""Bringing a recorded state back to life in an engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

from eu_audit.checkpoints import restore
from eu_audit.errors import BadInput

if TYPE_CHECKING:
    from eu_audit.runtime.engine import KVEngine
    from eu_audit.trace.session import SessionTrace


def rebuild_state(engine: KVEngine, trace: SessionTrace) -> None:
    """Rebuild a session's final cache from its recorded token ids (exact under the canonical
    schedule), then apply any recorded excision: how every bundle state is brought back to life."""
    engine.reset()
    restore(engine, [], trace.session.final_manifest, {b.id: b for b in trace.blocks})
    if trace.session.kv_excised:
        excise = getattr(engine, "excise", None)
        if excise is None:
            raise BadInput(
                f"session {trace.session_id} was excised from KV tensors; engine '{engine.name}' "
                "holds none (use --engine hf)"
            )
        excise(trace.session.kv_excised)
