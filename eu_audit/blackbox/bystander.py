"""Bystanders and no-ops: what a forget must not do, and what it did not do.

- **A bystander** is a second tenant of the same agent, started beside the one that forgets and given
  memories of its own (nothing of z). After the first tenant's forget, every one of them must still be in
  each store of the bystander's dump that held it just before the forget: a forget for one user that wipes
  others (``delete_all(user_id)`` resetting a whole
  vector store, a compaction deleting history outside its window) loses them. The count lost is the
  metric ``bystander`` (``agent.bystander==0``); it needs ``memory_inject`` and ``store_dump``.
- **A no-op**: the agent's dump right after its forget equal to the one right before it. The forget
  changed nothing the agent itself reports keeping; the summary says so in those words
  (``AgentForgetRecord.changed``).
"""

from __future__ import annotations

import secrets
from collections import Counter
from dataclasses import dataclass

from eu_audit.blackbox.contract import MemoryRecord, StoreDump

#: the bystander's memories: (id, text, the phrase that must still be found in its dump)
RECORDS: tuple[tuple[str, str, str], ...] = (
    (
        "bystander-1",
        "Note: the team offsite is booked at Harbour Lodge for the second week of May.",
        "harbour lodge",
    ),
    ("bystander-2", "Note: my dentist appointment is on the 14th at 3 pm with Dr. Okafor.", "okafor"),
)


@dataclass
class Kept:
    """What the bystander still had after the forget."""

    records: int
    lost: int
    example: str = ""  # the first record lost


def new_name() -> str:
    """An opaque name, like every tenant's."""
    return secrets.token_hex(8)


def memories() -> list[MemoryRecord]:
    return [MemoryRecord(id=rid, text=text) for rid, text, _ in RECORDS]


def _stores_with(dump: StoreDump, phrase: str) -> set[str]:
    return {item.store for item in dump.items if phrase in item.text.lower()}


def kept(before: StoreDump, after: StoreDump) -> Kept:
    """Which of the bystander's memories are still where they were: a memory (found by its phrase, so a
    library that rewrites what it stores still counts as keeping it) is lost when a store that showed it
    right before the forget no longer does. Store by store, because an agent's history or audit table
    that still quotes a memory its memory store lost does not keep the memory (mem0#3746: the vector store
    reset, the history rows left)."""
    lost = []
    for _, text, phrase in RECORDS:
        gone = sorted(_stores_with(before, phrase) - _stores_with(after, phrase))
        if gone or not _stores_with(before, phrase):
            where = f"gone from {', '.join(gone)}" if gone else "never stored"
            lost.append(f"{text} ({where})")
    return Kept(len(RECORDS), len(lost), lost[0] if lost else "")


def changed(before: StoreDump, after: StoreDump) -> bool:
    """Whether a forget changed what the dump shows (items compared by store and text, in any order)."""

    def items(d: StoreDump) -> Counter[tuple[str, str]]:
        return Counter((i.store, i.text) for i in d.items)

    return items(before) != items(after)
