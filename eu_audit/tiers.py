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
#: a chat message's role -> the prompt tier it is counted in
TIERS = {
    "system": "system prompt (retrieved memory, summary)",
    "developer": "system prompt (retrieved memory, summary)",
    "user": "history: user turns",
    "assistant": "history: the agent's own turns",
    "tool": "tool results",
}
TOOL_CALLS = "history: the agent's tool calls"
TOOL_SPECS = "tool specs (names, descriptions, schemas)"
RESPONSE_FORMAT = "response format schema"
SPLIT = "split across the prompt's parts"
EMBEDDING = "embedding input (a memory search)"
RAW_PROMPT = "prompt"  # a completion prompt sent as one text

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
