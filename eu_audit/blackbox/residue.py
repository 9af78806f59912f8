"""What a black-box agent still holds of the target, seen from outside.

- ``residue_context``: the share of the agent's model calls after its forget (future turns, probes,
  samples, choices; read from the serve log by the harness's marks) whose prompt still carries a
  variant of z, and in which tier: the system prompt (retrieved memory, a summary), the user turns or
  the agent's own turns of the history, tool results, or an embedding request (a memory search).
- ``residue_store``: whether the agent's store dump still holds a variant of z, and in which store.
"""

from __future__ import annotations

import re
from typing import Any

from eu_audit.blackbox.contract import StoreDump
from eu_audit.matching import TargetMatcher
from eu_audit.trace.records import ResidueRecord
from eu_audit.trace.session import SessionTrace

_ROLE = re.compile(r"(?:<\|im_start\|>|<\|start_header_id\|>)\s*(\w+)")
#: the phases whose model calls come after the forget (for the b5 tenant: the same stage of its run)
AFTER = ("future", "probe", "sample", "choice")
TIERS = {
    "system": "system prompt (retrieved memory, summary)",
    "developer": "system prompt (retrieved memory, summary)",
    "user": "history: user turns",
    "assistant": "history: the agent's own turns",
    "tool": "tool results",
}
EMBEDDING = "embedding input (a memory search)"
RAW_PROMPT = "prompt"  # a completion prompt sent as one text


def snippet(text: str, matcher: TargetMatcher, width: int = 90) -> str:
    spans = matcher.spans(text)
    if not spans:
        return text[: 2 * width]
    a, b = spans[0]
    return (
        ("..." if a > width else "")
        + text[max(0, a - width) : b + width]
        + ("..." if b + width < len(text) else "")
    )


def prompt_parts(entry: dict[str, Any]) -> list[tuple[str, str]]:
    """(tier, text) of what one logged model call received."""
    if entry.get("endpoint") == "/v1/chat/completions":
        out = []
        for m in entry.get("messages") or []:
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            out.append((TIERS.get(str(m.get("role")), str(m.get("role"))), str(content or "")))
        return out
    if entry.get("endpoint") == "/v1/embeddings":
        return [(EMBEDDING, t) for t in entry.get("input") or []]
    if entry.get("segments"):  # a token-id prompt sent segment by segment: each opens with its role
        out = []
        for seg in entry["segments"]:
            m = _ROLE.search(seg[:80])
            role = m.group(1) if m else "assistant"  # a turn's body carries no header: the agent's own
            out.append((TIERS.get(role, role), seg))
        return out
    return [(RAW_PROMPT, str(entry.get("prompt_text") or entry.get("prompt") or ""))]


def context_residue(
    record: ResidueRecord,
    entries: list[dict[str, Any]],
    trace: SessionTrace,
    digest: str,
    have_log: bool,
    key: str,
    run: str,
) -> ResidueRecord:
    """``record`` with the serve-log side filled in for ``trace``'s tenant: the requests marked post-forget
    by the harness's control key ``key`` (a mark set under any other key is not this run's) for a tenant
    of run ``run`` (another run on the same serve reuses the session ids, never the run id)."""
    if not have_log:
        return record
    if record.skipped:
        return record
    matcher = trace.matcher()

    def counted(mark: dict[str, Any]) -> bool:  # a recheck's record counts that event's calls only
        if record.after:
            return mark.get("phase") == "recheck" and mark.get("event") == record.after
        return mark.get("phase") in AFTER

    mine = [
        e
        for e in entries
        if (e.get("mark") or {}).get("key") == key
        and str((e.get("mark") or {}).get("tenant", "")).startswith(f"{run}-")
        and (e.get("mark") or {}).get("session") == trace.session_id
        and counted(e.get("mark") or {})
    ]
    calls = [
        e for e in mine if e.get("endpoint") in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
    ]
    tiers: dict[str, int] = {}
    example = ""
    with_z = 0
    for e in calls:
        hit = False
        for tier, text in prompt_parts(e):
            if matcher.found_in(text):
                tiers[tier] = tiers.get(tier, 0) + 1
                hit = True
                example = example or f"[{tier}] {snippet(text, matcher)}"
        with_z += hit
    return record.model_copy(
        update={
            "context_calls": len(calls),
            "context_calls_with_z": with_z,
            "context_tiers": tiers,
            "context_example": example,
            "serve_log_digest": digest,
        }
    )


def store_residue(session_id: str, dump: StoreDump | None, matcher: TargetMatcher) -> ResidueRecord:
    if dump is None:
        return ResidueRecord(session_id=session_id)
    holding = [item for item in dump.items if matcher.found_in(item.text)]
    every: dict[str, int] = {}
    for item in dump.items:
        every[item.store] = every.get(item.store, 0) + 1
    stores: dict[str, int] = {}
    for item in holding:
        stores[item.store] = stores.get(item.store, 0) + 1
    example = f"[{holding[0].store}] {snippet(holding[0].text, matcher)}" if holding else ""
    return ResidueRecord(
        session_id=session_id,
        store_items=len(dump.items),
        store_items_with_z=len(holding),
        store_tiers=stores,
        store_example=example,
        stores=every,
    )
