"""An agent eu-audit's authors never saw, as many are built: SQLite for its history and memories, a vector
twin of each memory (embedded through eu-audit serve, float32 BLOBs), one database file per tenant, WAL
journaling. It answers without a model (what it keeps is the point). Its forget, by mode:

- ``hiding``: deletes nothing, and its dump leaves out every row that holds z (SQLite keeps them);
- ``plain``: deletes the rows that hold z, and their vectors, with ``secure_delete`` off (upstream
  SQLite's default; Debian builds it on) and no checkpoint: the rows are gone, their bytes stay in the
  WAL and the pages' free space;
- ``secure``: the same with ``PRAGMA secure_delete = ON`` and a WAL checkpoint (TRUNCATE): nothing left;
- ``overdelete``: deletes every tenant's database, not only the forgetting one's (mem0#3746's
  ``delete_all`` resetting the whole store);
- ``cascade``: deletes the memories and trusts ``ON DELETE CASCADE`` for their vectors, with
  ``PRAGMA foreign_keys`` off (SQLite's default, as in langgraph#8757): the vectors stay, orphaned.

Its ``files`` names the tenant's database, so eu-audit reads it below the dump.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import struct
import tempfile
from itertools import count
from pathlib import Path
from typing import Any

from eu_audit.blackbox.contract import (
    Capabilities,
    ForgetReceipt,
    ForgetRequest,
    MemoryRecord,
    Message,
    OfferedTool,
    StoredItem,
    StoreDump,
    StoreFiles,
    Turn,
)
from eu_audit.matching import TargetMatcher

from .scripted_agents import _http

SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, tenant TEXT, role TEXT, content TEXT);
CREATE TABLE IF NOT EXISTS memories (id INTEGER PRIMARY KEY, tenant TEXT, text TEXT);
CREATE TABLE IF NOT EXISTS memory_vectors (
    memory_id INTEGER REFERENCES memories(id) ON DELETE CASCADE, tenant TEXT, embedding BLOB
);
"""


class SqliteAgent:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.serve = os.environ["EU_AUDIT_TEST_SERVE"].rstrip("/")
        given = os.environ.get("SQLITE_AGENT_ROOT")  # where its databases go (a test's --store-path names it)
        self.root = Path(given) if given else Path(tempfile.mkdtemp(prefix="sqlite-agent-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.url: dict[str, str] = {}
        self.tenant_of: dict[str, str] = {}
        self.ids = count()

    def capabilities(self) -> Capabilities:
        return Capabilities(
            name=f"sqlite-{self.mode}",
            memory_inject=True,
            store_dump=True,
            store_files=not os.environ.get("SQLITE_AGENT_NO_FILES"),  # bench/forensics_cost.py turns it off
            tenant_model_url=True,
        )

    def _db(self, tenant: str) -> sqlite3.Connection:
        con = sqlite3.connect(self.root / f"{tenant}.sqlite")
        con.execute("PRAGMA journal_mode = WAL")
        con.executescript(SCHEMA)
        return con

    def _embed(self, tenant: str, text: str) -> bytes:
        status, got = _http("POST", self.url[tenant] + "/embeddings", {"input": [text]})
        assert status == 200, status
        vec = got["data"][0]["embedding"]
        return struct.pack(f"<{len(vec)}f", *vec)

    def start(
        self, tenant: str, *, seed: int, tools: list[OfferedTool], model_base_url: str | None = None
    ) -> str:
        self.url[tenant] = model_base_url or self.serve + "/v1"
        sid = f"{tenant}-{next(self.ids)}"
        self.tenant_of[sid] = tenant
        self._db(tenant).close()
        return sid

    def send(self, session_id: str, message: Message) -> Turn:
        tenant = self.tenant_of[session_id]
        with self._db(tenant) as con:
            con.execute(
                "INSERT INTO messages (tenant, role, content) VALUES (?, ?, ?)",
                (tenant, message.role, message.content or ""),
            )
        return Turn(text="noted")

    def inject_memory(self, tenant: str, record: MemoryRecord) -> Turn:
        vector = self._embed(tenant, record.text)
        with self._db(tenant) as con:
            cur = con.execute("INSERT INTO memories (tenant, text) VALUES (?, ?)", (tenant, record.text))
            con.execute(
                "INSERT INTO memory_vectors (memory_id, tenant, embedding) VALUES (?, ?, ?)",
                (cur.lastrowid, tenant, vector),
            )
        return Turn(text="")

    def forget(self, tenant: str, request: ForgetRequest) -> ForgetReceipt:
        m = TargetMatcher.of(request.target, request.variants)
        if self.mode == "overdelete":  # "delete all": every tenant's database, not only this one's
            for db in self.root.glob("*.sqlite*"):
                db.unlink(missing_ok=True)
            return ForgetReceipt(status="ok", detail="deleted all")
        if self.mode == "hiding":
            return ForgetReceipt(status="ok", detail="(hidden from the dump)")
        con = self._db(tenant)
        # upstream SQLite's default is off; Debian's build turns it on, so say it either way
        con.execute(f"PRAGMA secure_delete = {'ON' if self.mode in ('secure', 'cascade') else 'OFF'}")
        with con:
            for table, col in (("messages", "content"), ("memories", "text")):
                doomed = [i for i, text in con.execute(f"SELECT id, {col} FROM {table}") if m.found_in(text)]
                for i in doomed:
                    if table == "memories" and self.mode != "cascade":
                        con.execute("DELETE FROM memory_vectors WHERE memory_id = ?", (i,))
                    con.execute(f"DELETE FROM {table} WHERE id = ?", (i,))
        if self.mode in ("secure", "cascade"):
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.close()
        return ForgetReceipt(status="ok", detail=f"deleted ({self.mode})")

    def reset(self, tenant: str) -> None:
        for suffix in ("", "-wal", "-shm"):
            (self.root / f"{tenant}.sqlite{suffix}").unlink(missing_ok=True)

    def dump(self, tenant: str) -> StoreDump:
        items: list[StoredItem] = []
        con = self._db(tenant)
        rows: list[tuple[str, Any, str]] = [
            *(("history", i, t) for i, t in con.execute("SELECT id, content FROM messages")),
            *(("memory", i, t) for i, t in con.execute("SELECT id, text FROM memories")),
        ]
        con.close()
        m = self._forgotten.get(tenant) if self.mode == "hiding" else None
        for store, i, text in rows:
            if m is None or not m.found_in(text):
                items.append(StoredItem(store=store, id=str(i), text=text))
        return StoreDump(items=items)

    @property
    def _forgotten(self) -> dict[str, TargetMatcher]:
        """A hiding agent hides every row carrying any target it has seen named (it remembers none)."""
        return getattr(self, "_hide", {})

    def files(self, tenant: str) -> StoreFiles:
        return StoreFiles(paths=[str(self.root / f"{tenant}.sqlite")])

    def __del__(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class HidingAgent(SqliteAgent):
    def __init__(self) -> None:
        super().__init__("hiding")
        self._hide: dict[str, TargetMatcher] = {}

    def forget(self, tenant: str, request: ForgetRequest) -> ForgetReceipt:
        self._hide[tenant] = TargetMatcher.of(request.target, request.variants)
        return super().forget(tenant, request)


def hiding() -> SqliteAgent:
    return HidingAgent()


def plain() -> SqliteAgent:
    return SqliteAgent("plain")


def secure() -> SqliteAgent:
    return SqliteAgent("secure")


def cascade() -> SqliteAgent:
    return SqliteAgent("cascade")


def overdelete() -> SqliteAgent:
    return SqliteAgent("overdelete")
