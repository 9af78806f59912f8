"""Where z can be found in an agent, in the words every report uses: the tiers of a prompt the model
received, eu-audit's own reads of the agent's files, and the kinds of tampering the harness looks for.
One vocabulary below both the black-box harness that finds z (``eu_audit.blackbox``) and the audits that
report it (``eu_audit.audits``), so neither imports the other for a name."""

from __future__ import annotations

import re
from typing import Any

from eu_audit.registry import Registry

#: the phases whose model calls come after the forget (for the b5 tenant: the same stage of its run)
AFTER = ("future", "probe", "sample", "choice")
#: the prompt tiers of serve's log, each by its short id (the gate's ``prompt.<id>``, the key every audit
#: stores) -> the words a reader sees (a quoted example opens with them: ``[history: user turns] ...``)
PROMPT_TIER_LABELS = {
    "system": "system prompt (retrieved memory, summary)",
    "user": "history: user turns",
    "agent": "history: the agent's own turns",
    "calls": "history: the agent's tool calls",
    "tool": "tool results",
    "specs": "tool specs (names, descriptions, schemas)",
    "format": "response format schema",
    "split": "split across the prompt's parts",
    "embedding": "embedding input (a memory search)",
    "prompt": "prompt",  # a completion prompt sent as one text
}
#: a chat message's role -> the prompt tier it is counted in (a role outside these is its own tier)
ROLE_TIERS = {"system": "system", "developer": "system", "user": "user", "assistant": "agent", "tool": "tool"}
TOOL_CALLS = "calls"  # the agent's earlier tool calls, sent again in its history
TOOL_SPECS = "specs"
RESPONSE_FORMAT = "format"
SPLIT = "split"  # no one part holds z, the parts in order do
EMBEDDING = "embedding"
RAW_PROMPT = "prompt"
#: an audit or bundle written before the tiers had ids stored each under its label: read back as its id
_LABEL_TO_ID = {label: tier for tier, label in PROMPT_TIER_LABELS.items()}


def tier_label(tier: str) -> str:
    """The words a reader sees for a prompt tier (a role outside the known ones: its own name)."""
    return PROMPT_TIER_LABELS.get(tier, tier)


def tier_ids(counts: Any) -> Any:
    """Per-tier counts keyed by id, whatever an older writer keyed them by (its labels); anything that is
    no dict is left for the model's own validation to refuse."""
    if not isinstance(counts, dict):
        return counts
    out: dict[str, Any] = {}
    for k, v in counts.items():
        tier = _LABEL_TO_ID.get(str(k), str(k))
        out[tier] = out[tier] + v if tier in out and isinstance(v, int) else v
    return out


#: the channels eu-audit's own reads of an agent's files give (``disk.<tier>``, beside the dump's stores)
DISK_TIERS = ("rows", "orphans", "bytes", "vectors")

#: what the harness counts as tampering with the measurement, each in words
TAMPER_KINDS = {
    "control_refused": "control call(s) without the secret, refused",
    "control_foreign": "control call(s) with the secret that the harness never made",
    "unknown_route": "call(s) to a route or lane serve does not have",
    "stray_call": "model call(s) on a lane whose tenant was not being driven",
    "reference_z": "model call(s) of the reference tenant (never fed z) carrying z",
    "unfed_text": "model call(s) quoting a turn the harness had not yet sent that tenant",
    "reference_answer_z": "answer(s) of the reference tenant (never fed z) carrying z its model never wrote",
    "foreign_answer": "answer(s) given for this tenant that serve decoded only on another tenant's lane",
    "foreign_history": "model call(s) on this tenant's lane quoting another tenant's reply as its own turn",
    "unheard_turn": "user turn(s) answered for this tenant that reached the model only on another's lane",
}

#: the events after the forget that ``eu-audit gate --recheck`` runs (``after.<event>``), each registered
#: with how it runs by ``eu_audit.blackbox.recheck`` (loaded by name on first use), plus ``turns-N``
RECHECKS: Registry[Any] = Registry("rechecks", builtins=("eu_audit.blackbox.recheck",))
TURNS = re.compile(r"^turns-(\d+)$")
MAX_TURNS = 50


def recheck_problem(name: str) -> str:
    """Why ``name`` is no recheck event ("" when it is one: a registered event, or turns-N in range)."""
    m = TURNS.match(name)
    if m:
        n = int(m.group(1))
        return "" if 1 <= n <= MAX_TURNS else f"N must be between 1 and {MAX_TURNS}"
    if name in RECHECKS:
        return ""
    return f"unknown event (known: {', '.join([*RECHECKS.names(), 'turns-N'])})"
