"""A persistent plaintext memory store on disk (SQLite), re-injected at session start."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path

#: memory records the model wrote (derived artifacts) are named ``wb-t<turn>``
WRITE_BACK_PREFIX = "wb-t"


def _private_db(path: Path) -> sqlite3.Connection:
    """A SQLite connection several sessions' threads may share (every use holds the store's lock)."""
    if str(path) == ":memory:":  # an ephemeral store (a method's scratch state)
        return sqlite3.connect(":memory:", check_same_thread=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))  # created private: it holds targets
    return sqlite3.connect(path, check_same_thread=False)


def memory_text(records: Iterable[tuple[str, str]]) -> str:
    """How the agent surfaces the persistent store: one system message listing (id, text) records."""
    lines = [f"- [{rid}] {text}" for rid, text in records]
    return "Long-term memory about the user:\n" + ("\n".join(lines) if lines else "(no records)")


class MemoryStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.RLock()
        self.db = _private_db(path)
        self.db.execute("""CREATE TABLE IF NOT EXISTS memory (
            session_id TEXT, record_id TEXT, text TEXT, source_ids TEXT, deleted INTEGER DEFAULT 0,
            PRIMARY KEY (session_id, record_id))""")
        self.db.commit()

    def add(self, session_id: str, record_id: str, text: str, source_ids: list[str]) -> None:
        with self.lock:
            self.db.execute(
                "INSERT OR REPLACE INTO memory VALUES (?, ?, ?, ?, 0)",
                (session_id, record_id, text, json.dumps(source_ids)),
            )
            self.db.commit()

    def delete(self, session_id: str, record_id: str) -> bool:
        with self.lock:
            cur = self.db.execute(
                "UPDATE memory SET deleted = 1, text = '' WHERE session_id = ? AND record_id = ?",
                (session_id, record_id),
            )
            self.db.commit()
            return cur.rowcount > 0

    def records(self, session_id: str) -> list[tuple[str, str, list[str]]]:
        with self.lock:
            rows = self.db.execute(
                "SELECT record_id, text, source_ids FROM memory WHERE session_id = ? "
                "AND deleted = 0 ORDER BY rowid",
                (session_id,),
            ).fetchall()
        return [(r[0], r[1], json.loads(r[2])) for r in rows]

    def close(self) -> None:
        self.db.close()


class Outbox:
    """A real sink for consequential tools: each fired call is a row keyed by its call id, so a replay
    that re-issues the same call id is deduplicated instead of firing twice."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.RLock()
        self.db = _private_db(path)
        self.db.execute("""CREATE TABLE IF NOT EXISTS outbox (
            call_id TEXT PRIMARY KEY, session_id TEXT, tool TEXT, arguments TEXT)""")
        self.db.commit()

    def fire(self, call_id: str, session_id: str, tool: str, arguments: dict[str, object]) -> bool:
        """Perform the side effect once; False when this call id already fired (deduplicated)."""
        with self.lock:
            cur = self.db.execute(
                "INSERT OR IGNORE INTO outbox VALUES (?, ?, ?, ?)",
                (call_id, session_id, tool, json.dumps(arguments, sort_keys=True)),
            )
            self.db.commit()
            return cur.rowcount == 1

    def fired(self, call_id: str) -> bool:
        with self.lock:
            row = self.db.execute("SELECT 1 FROM outbox WHERE call_id = ?", (call_id,)).fetchone()
        return row is not None

    def rows(self, session_id: str | None = None) -> list[tuple[str, str, str, str]]:
        q = "SELECT call_id, session_id, tool, arguments FROM outbox"
        args: tuple[str, ...] = ()
        if session_id is not None:
            q += " WHERE session_id = ?"
            args = (session_id,)
        with self.lock:
            return list(self.db.execute(q + " ORDER BY rowid", args).fetchall())

    def close(self) -> None:
        self.db.close()
