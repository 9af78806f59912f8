"""What a black-box agent still holds of the target, seen from outside.

- ``residue_context``: the share of the agent's model calls after its forget (future turns, probes,
  samples, choices; read from the serve log by the harness's marks) whose prompt still carries a
  variant of z, and in which tier: the system prompt (retrieved memory, a summary), the user turns or
  the agent's own turns of the history, its earlier tool calls, tool results, the offered tools'
  descriptions and schemas, a response format's schema, an embedding request (a memory search), or
  the prompt read whole when z is split over two of its parts. Every string the request carries to the
  model is read, not one field of it.
- ``residue_store``: whether the agent's store dump still holds a variant of z, and in which store.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from eu_audit.blackbox.contract import StoreDump
from eu_audit.matching import TargetMatcher
from eu_audit.matching.decoders import decoded_views
from eu_audit.serve.api import CHAT_SHAPED, MODEL_ENDPOINTS, LogEntry, LogMark
from eu_audit.tiers import (
    AFTER,
    EMBEDDING,
    RAW_PROMPT,
    RESPONSE_FORMAT,
    ROLE_TIERS,
    SPLIT,
    TOOL_CALLS,
    TOOL_SPECS,
    tier_label,
)
from eu_audit.trace.records import ResidueRecord
from eu_audit.trace.session import SessionTrace

_ROLE = re.compile(r"(?:<\|im_start\|>|<\|start_header_id\|>)\s*(\w+)")


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


def strings(obj: Any) -> Iterator[str]:
    """Every string in a JSON value, keys included (a schema's property names are read by the model)."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield str(k)
            yield from strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from strings(v)


def _message_parts(m: dict[str, Any]) -> list[tuple[str, str]]:
    """(tier, text) of one chat message: its content in any shape, its tool calls (name and arguments:
    what an agent that keeps its tool-call history sends again), and every other string it carries."""
    tier = ROLE_TIERS.get(str(m.get("role")), str(m.get("role")))
    out = [(tier, " ".join(strings(m.get("content"))))]
    for c in m.get("tool_calls") or []:
        out.append((TOOL_CALLS, " ".join(strings(c.get("function") if isinstance(c, dict) else c))))
    rest = {k: v for k, v in m.items() if k not in ("role", "content", "tool_calls")}
    if rest:
        out.append((tier, " ".join(strings(rest))))
    return out


def prompt_parts(entry: LogEntry) -> list[tuple[str, str]]:
    """(tier, text) of what one logged model call received: every string of the request that reaches the
    model (messages with their tool calls, the offered tools' names, descriptions and schemas, a response
    format's schema), not one field of it."""
    if entry.endpoint in CHAT_SHAPED:  # the Responses and Messages APIs are logged as chat
        out = [part for m in entry.messages or [] for part in _message_parts(m)]
        out += [(TOOL_SPECS, " ".join(strings(t))) for t in entry.tool_specs or []]
        if entry.response_format:
            out.append((RESPONSE_FORMAT, " ".join(strings(entry.response_format))))
        return out
    if entry.endpoint == "/v1/embeddings":
        return [(EMBEDDING, t) for t in entry.input or []]
    if entry.segments:  # a token-id prompt sent segment by segment: each opens with its role
        out = []
        for seg in entry.segments:
            m = _ROLE.search(seg[:80])
            role = m.group(1) if m else "assistant"  # a turn's body carries no header: the agent's own
            out.append((ROLE_TIERS.get(role, role), seg))
        return out
    return [(RAW_PROMPT, entry.prompt_text or "")]


def tiers_with_z(entry: LogEntry, matcher: TargetMatcher) -> tuple[list[str], str]:
    """The tiers of one logged call that hold z, and one quoted place. A target no single part holds but
    the parts read in order do (split over two messages, or a message and a tool call) is found in the
    whole prompt and named ``SPLIT``."""
    parts = prompt_parts(entry)
    tiers: list[str] = []
    example = ""
    for tier, text in parts:
        if matcher.found_in(text):
            if tier not in tiers:
                tiers.append(tier)
            example = example or f"[{tier_label(tier)}] {snippet(text, matcher)}"
    if not tiers:
        whole = "\n".join(text for _, text in parts)
        if matcher.found_in(whole):
            tiers.append(SPLIT)
            example = f"[{tier_label(SPLIT)}] {snippet(whole, matcher)}"
    if not tiers:
        for tier, text in parts:
            for how, view in decoded_views(text):
                if matcher.found_in(view):
                    if tier not in tiers:
                        tiers.append(tier)
                    # the decoded view, masked: the encoded text would carry z past every mask
                    example = example or f"[{tier_label(tier)}, sent as {how}] {snippet(view, matcher)}"
                    break
    return tiers, example


def context_residue(
    record: ResidueRecord,
    entries: list[LogEntry],
    trace: SessionTrace,
    digest: str,
    have_log: bool,
    key: str,
    tenant: str,
) -> ResidueRecord:
    """``record`` with the serve-log side filled in for ``trace``'s tenant, named ``tenant`` in serve's log:
    the requests marked post-forget by the harness's control key ``key`` (a mark set under any other key is
    not this run's) for that tenant (an opaque name, fresh in every run; the log carries no session or
    role)."""
    if not have_log:
        return record
    if record.skipped:
        return record
    matcher = trace.matcher()

    def counted(mark: LogMark | None) -> bool:  # a recheck's record counts that event's calls only
        if mark is None or mark.key != key or mark.tenant != tenant:
            return False
        if record.after:
            return mark.phase == "recheck" and mark.event == record.after
        return mark.phase in AFTER

    calls = [e for e in entries if counted(e.mark) and e.endpoint in MODEL_ENDPOINTS]
    tiers: dict[str, int] = {}
    example = ""
    with_z = 0
    for e in calls:
        found, where = tiers_with_z(e, matcher)
        for tier in found:
            tiers[tier] = tiers.get(tier, 0) + 1
        example = example or where
        with_z += bool(found)
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
