"""Forgets that come back: events a deployed agent meets after its forget, each followed by the same
checks as the forget itself.

A forget can pass at once and fail later: a write-behind cache or a journal that a restart loads back, a
compaction that re-summarises rows the forget left in a history table, a memory extractor that re-adds a
fact from the transcript a few turns on, a re-index that rebuilds a deleted vector from the row it came
from. ``eu-audit gate --recheck restart,compact,reindex,turns-3`` runs the events in that order on the
agent's tenant, after its probes and its first dump, and after each one checks again:

- the prompts its model received during the event (serve's log, marked phase ``recheck`` and the event),
- what it answered in the event's turns,
- its store dump.

One check runs earlier: ``at-once`` reads the store dump right after the forget returns, before the
episode's later turns (nothing runs, no model is called). The first dump comes after those turns and the
probes, so a copy the forget left in a window that later messages evict (mem0's last-10 ``messages``
table, which its extraction prompt renders) is gone by then: only this check sees it. Wherever it is
listed, it runs first.

Each event gives the session one more residue record (``ResidueRecord.after``). The residue rules
(``residue_context``, ``residue_store``) count every record, so z coming back fails them; the channel
``after.<event>`` names the event (``agent.after.restart==0``). An event the agent lacks (``restart``
without the capability) is recorded as skipped with the reason: its figures are unknown, never clean.

Add another event with ``RECHECKS.add("name", Recheck(needs, run))`` (``RECHECKS`` is
``eu_audit.tiers.RECHECKS``, the vocabulary the audits read too; or the entry-point group
``eu_audit.rechecks``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from eu_audit.blackbox.adapter import AgentUnderTest
from eu_audit.blackbox.contract import Capabilities, Turn
from eu_audit.errors import BadInput
from eu_audit.tiers import RECHECKS, TURNS, recheck_problem

#: unrelated user turns, the same for every agent and run: a recheck asks nothing about the target
SMALL_TALK = (
    "What is a good way to start a quiet Sunday morning?",
    "Give me one tip for keeping a houseplant alive.",
    "Suggest a name for a small grey cat.",
    "How long should I boil an egg for a soft yolk?",
    "What is a simple stretch to do after sitting all day?",
    "Recommend a board game for four people.",
)


class RecheckTarget(Protocol):
    """What an event needs of the driven tenant (``tenant_run.TenantRun`` is one)."""

    agent: AgentUnderTest
    caps: Capabilities
    tenant: str
    session: str  # the tenant's session the episode ran in

    def call(self, what: str, fn: Callable[[], Any]) -> Any: ...

    def say(self, what: str, text: str) -> list[str]:
        """Send one user turn to the tenant's session; its answers (tool calls answered, never run)."""
        ...


@dataclass(frozen=True)
class Recheck:
    """One event: what it needs of the agent (a ``Capabilities`` flag, or None) and how it runs."""

    needs: str | None
    run: Callable[[RecheckTarget, str], list[str]]  # (tenant, the event's name) -> the answers it drew
    #: checked right after the forget, before the episode's later turns (else after the probes)
    at_forget: bool = False


def _restart(target: RecheckTarget, name: str) -> list[str]:
    target.call(f"recheck {name}", lambda: target.agent.restart(target.tenant))
    return target.say(name, SMALL_TALK[0])  # a turn after it: what the restarted agent reads


def _compact(target: RecheckTarget, name: str) -> list[str]:
    turn: Turn = target.call(f"recheck {name}", lambda: target.agent.compact(target.session))
    return [turn.text, *target.say(name, SMALL_TALK[1])]


def _reindex(target: RecheckTarget, name: str) -> list[str]:
    target.call(f"recheck {name}", lambda: target.agent.reindex(target.tenant))
    return target.say(name, SMALL_TALK[2])  # a turn after it: what the rebuilt index feeds the model


def _at_once(target: RecheckTarget, name: str) -> list[str]:
    return []  # nothing happens: the checks read what the forget itself left


RECHECKS.add("at-once", Recheck("store_dump", _at_once, at_forget=True))  # the dump right after the forget
RECHECKS.add("restart", Recheck("restart", _restart))  # the agent reloads what it persisted, then a turn
RECHECKS.add("compact", Recheck("compact", _compact))  # the agent's own compaction, then a turn
RECHECKS.add("reindex", Recheck("reindex", _reindex))  # the stack's re-index / re-sync, then a turn


def recheck(name: str) -> tuple[Recheck, int]:
    """The event a name means, and its turn count for ``turns-N`` (else 0)."""
    problem = recheck_problem(name)
    if problem:
        raise BadInput(f"--recheck {name}: {problem}")
    m = TURNS.match(name)
    if m:
        return Recheck(None, _turns), int(m.group(1))  # n turns of unrelated conversation
    return RECHECKS.get(name), 0


def _turns(target: RecheckTarget, name: str) -> list[str]:
    _, n = recheck(name)
    out: list[str] = []
    for i in range(n):
        out += target.say(name, SMALL_TALK[i % len(SMALL_TALK)])
    return out


def parse_rechecks(text: str | None) -> tuple[str, ...]:
    """``restart,compact,turns-3`` -> the event names in order, each checked (exit 2 before any model
    runs). An event may appear once."""
    if not text:
        return ()
    names = tuple(part.strip().lower() for part in text.split(",") if part.strip())
    for name in names:
        recheck(name)
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise BadInput(f"--recheck: {', '.join(dup)} named twice (each event runs once, in order)")
    return names


def at_forget(name: str) -> bool:
    """Whether the event is checked right after the forget (``at-once``); False for a name no longer
    registered (a bundle recorded with a plugin's event)."""
    try:
        return recheck(name)[0].at_forget
    except BadInput:
        return False


def lacking(name: str, caps: Capabilities) -> str:
    """Why the agent cannot take this event ('' when it can)."""
    needs = recheck(name)[0].needs
    if needs and not getattr(caps, needs, False):
        return f"agent lacks {needs}"
    return ""


def tool_refusal(name: str) -> str:
    """What a tool call made during a recheck is answered with: no tool runs there (nothing the audit
    counts is done), and the agent hears why."""
    return json.dumps({"error": f"tools are not available during the recheck '{name}'"})
