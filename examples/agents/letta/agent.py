"""A Letta agent (the Letta server with its SQLite store), served over eu-audit's agent contract.

Letta keeps an agent's memory in tiers: *core memory* blocks in every prompt (here the tenant's
``human`` block, shared by all of the tenant's Letta agents, as Letta's docs show for shared memory),
*recall memory* (every message, searchable) and *archival memory* (passages in a vector store). Each
contract session is a Letta agent of the tenant; the agent's own tools (``send_message``,
``core_memory_append``, ``archival_memory_insert`` ...) run on the Letta server, so the scenario's tools
are not offered to it and it answers in text. Its forget uses Letta's delete APIs: the ``human`` block
rewritten without the lines that carry the target (``blocks.modify``), the archival passages that carry it
deleted (``agents.passages.delete``), and the messages of every agent whose history carries it reset
(``agents.messages.reset``). Its dump reads Letta's SQLite file, soft-deleted rows included.

This script starts the Letta server itself (``letta server``, its data under ``--data``), so ``restart`` is
a real restart of that process. Run it with the Python of a venv where Letta is installed; Letta 0.11.7 is
the last server release that keeps SQLite (0.12+ needs Postgres with pgvector; PyPI's ``letta`` 0.32+ is
Letta Code, a terminal client), and its dependencies must be resolved as of its release:

    uv venv letta-venv && uv pip install --python letta-venv/bin/python "letta[sqlite,server]==0.11.7" \\
        --exclude-newer 2025-09-05
    OPENAI_BASE_URL=http://127.0.0.1:8088/v1 \\
        letta-venv/bin/python examples/agents/letta/agent.py --port 9006 --data /tmp/letta-agent
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from fastapi import HTTPException
from letta_client import Letta

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the contract kit beside the agents
from contract_kit import (
    ForgetRequest,
    MemoryRecord,
    Message,
    StartSession,
    Tenants,
    arguments,
    norm,
    serve_agent,
)

PERSONA = "I am a personal assistant agent acting for one user. I am brief."
EMBED_DIMS = 384  # MiniLM, what eu-audit serve's /v1/embeddings returns
TEXT_TABLES = {  # Letta's tables that hold text, and how a row is tied to an agent or block
    "messages": "SELECT id, coalesce(text, '') || ' ' || coalesce(content, ''), is_deleted FROM messages "
    "WHERE agent_id = ?",
    "block": "SELECT id, value, is_deleted FROM block WHERE id = ?",
    "block_history": "SELECT id, value, is_deleted FROM block_history WHERE block_id = ?",
    "archival_passages": "SELECT p.id, p.text, p.is_deleted FROM archival_passages p "
    "JOIN archives_agents a ON a.archive_id = p.archive_id WHERE a.agent_id = ?",
}


class LettaAgent(Tenants):
    def __init__(
        self, data: Path, model: str, forget: str = "letta", letta_port: int = 8283, max_steps: int = 4
    ) -> None:
        super().__init__(data)
        data.mkdir(parents=True, exist_ok=True)
        self.data, self.model, self.forget_mode, self.port = data, model, forget, letta_port
        self.max_steps = max_steps
        self.tenants: dict[str, dict[str, Any]] = self._load()  # tenant -> human block id, agent ids
        self.server: subprocess.Popen[bytes] | None = None
        self.start_server()
        self.client = Letta(base_url=f"http://127.0.0.1:{self.port}", timeout=280)  # a turn may take calls

    # --- the Letta server, a process of its own ------------------------------------------------------

    def start_server(self) -> None:
        home = self.data / "home"
        home.mkdir(exist_ok=True)
        env = {**os.environ, "HOME": str(home), "OPENAI_API_KEY": "none", "LETTA_TELEMETRY_DISABLED": "true"}
        letta = Path(sys.executable).with_name("letta")
        health = f"http://127.0.0.1:{self.port}/v1/health/"
        try:  # a server left on the port (another run's) would answer in ours' place, with its own data
            urllib.request.urlopen(health, timeout=2)
        except OSError:
            pass
        else:
            raise RuntimeError(
                f"port {self.port} already answers as a Letta server: stop it or pass --letta-port"
            )
        log = open(self.data / "letta-server.log", "ab")  # noqa: SIM115 (the server's lifetime)
        # cwd: the server writes files (its OpenAPI schema) where it runs
        self.server = subprocess.Popen(
            [str(letta), "server", "--port", str(self.port)], env=env, stdout=log, stderr=log, cwd=home
        )
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                urllib.request.urlopen(health, timeout=2)
                return
            except OSError:
                if self.server.poll() is not None:
                    raise RuntimeError(
                        f"the Letta server exited ({self.server.returncode}): see letta-server.log"
                    ) from None
                time.sleep(1)
        raise RuntimeError("the Letta server did not answer within 180 s")

    def stop_server(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()
            self.server.wait(timeout=60)

    # --- plumbing ---------------------------------------------------------------------------------

    def _load(self) -> dict[str, dict[str, Any]]:
        path = self.data / "tenants.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def _save(self) -> None:
        (self.data / "tenants.json.tmp").write_text(json.dumps(self.tenants))
        (self.data / "tenants.json.tmp").replace(self.data / "tenants.json")

    def tenant_of(self, sid: str) -> str:
        for tenant, t in self.tenants.items():
            if sid in t["agents"]:
                return tenant
        raise HTTPException(404, f"no session {sid}")

    def letta(self, what: str, fn: Any) -> Any:
        """A Letta call; its own error fails the turn, named."""
        try:
            return fn()
        except Exception as exc:
            raise HTTPException(
                500, f"Letta's {what} failed: {type(exc).__name__}: {str(exc)[:400]}"
            ) from exc

    def human(self, tenant: str) -> str:
        t = self.tenants.setdefault(tenant, {"agents": []})
        if "block" not in t:
            t["block"] = self.letta(
                "blocks.create", lambda: self.client.blocks.create(label="human", value="")
            ).id
            self._save()
        return str(t["block"])

    # --- the contract -----------------------------------------------------------------------------

    def start(self, body: StartSession) -> dict[str, Any]:
        if body.model_base_url:
            self.bases[body.tenant] = body.model_base_url
        base = self.bases.get(body.tenant, self.base)
        block = self.human(body.tenant)
        llm = {
            "model": self.model,
            "model_endpoint_type": "openai",
            "model_endpoint": base,
            "context_window": 8192,
        }
        embed = {
            "embedding_endpoint_type": "openai", "embedding_endpoint": base,
            "embedding_model": "all-MiniLM-L6-v2", "embedding_dim": EMBED_DIMS, "embedding_chunk_size": 300,
        }  # fmt: skip
        agent = self.letta(
            "agents.create",
            lambda: self.client.agents.create(
                memory_blocks=[{"label": "persona", "value": PERSONA}], block_ids=[block],
                llm_config=llm, embedding_config=embed, include_base_tools=True,
            ),
        )  # fmt: skip
        self.tenants[body.tenant]["agents"].append(agent.id)
        self._save()
        return {"session_id": agent.id}

    def send(self, sid: str, body: Message) -> dict[str, Any]:
        text = body.content if body.role == "user" else f"Tool result ({body.name}): {body.content}"
        got = self.letta(
            "agents.messages.create",
            lambda: self.client.agents.messages.create(
                sid, messages=[{"role": "user", "content": text}], max_steps=self.max_steps
            ),
        )
        said = [str(m.content) for m in got.messages if getattr(m, "message_type", "") == "assistant_message"]
        return {"text": "\n".join(said), "actions": []}

    def inject_memory(self, tenant: str, body: MemoryRecord) -> dict[str, Any]:
        """As Letta's own ``core_memory_append`` leaves a fact: a line of the ``human`` block."""
        block = self.human(tenant)
        old = self.letta("blocks.retrieve", lambda: self.client.blocks.retrieve(block)).value or ""
        self.letta(
            "blocks.modify", lambda: self.client.blocks.modify(block, value=(old + "\n" + body.text).strip())
        )
        return {"text": "", "actions": []}

    def forget(self, tenant: str, body: ForgetRequest) -> dict[str, Any]:
        if self.forget_mode == "none":
            return {"status": "ok", "detail": "forget disabled (--forget none)", "receipt": {}}
        needles = [norm(v) for v in [body.target, *body.variants] if norm(v)]

        def carries(text: str) -> bool:
            return any(n in norm(text) for n in needles)

        block = self.human(tenant)
        value = self.letta("blocks.retrieve", lambda: self.client.blocks.retrieve(block)).value or ""
        kept = "\n".join(line for line in value.splitlines() if not carries(line))
        self.letta("blocks.modify", lambda: self.client.blocks.modify(block, value=kept))
        passages, reset = [], []
        for agent in self.tenants[tenant]["agents"]:
            for p in self.letta(
                "passages.list", lambda a=agent: self.client.agents.passages.list(a, limit=1000)
            ):
                if carries(p.text):
                    self.letta(
                        "passages.delete", lambda a=agent, p=p: self.client.agents.passages.delete(a, p.id)
                    )
                    passages.append(p.id)
            history = self.letta(
                "messages.list", lambda a=agent: self.client.agents.messages.list(a, limit=1000)
            )
            if any(carries(json.dumps(m.model_dump(), default=str)) for m in history):
                self.letta("messages.reset", lambda a=agent: self.client.agents.messages.reset(a))
                reset.append(agent)
        receipt = {
            "block_lines_removed": len(value.splitlines()) - len(kept.splitlines()),
            "passages": passages,
            "reset": reset,
        }
        return {
            "status": "ok",
            "detail": f"block rewritten, {len(passages)} passages deleted, {len(reset)} histories reset",
            "receipt": receipt,
        }

    def reset(self, tenant: str) -> dict[str, Any]:
        t = self.tenants.pop(tenant, None)
        if t is not None:
            for agent in t["agents"]:
                self.letta("agents.delete", lambda a=agent: self.client.agents.delete(a))
            if "block" in t:
                self.letta("blocks.delete", lambda: self.client.blocks.delete(t["block"]))
        self._save()
        return {"ok": True}

    def restart(self, tenant: str) -> dict[str, Any]:
        """A real restart: the Letta server process is stopped and started again on its files."""
        self.stop_server()
        self.start_server()
        return {"ok": True}

    def dump(self, tenant: str) -> dict[str, Any]:
        """Every text row Letta's SQLite file holds for the tenant's agents and block, soft-deleted rows
        included (their store name says so)."""
        t = self.tenants.get(tenant, {"agents": []})
        db = sqlite3.connect(self.data / "home" / ".letta" / "sqlite.db")
        items = []
        try:
            for table, query in TEXT_TABLES.items():
                keys = ([t["block"]] if "block" in t else []) if table.startswith("block") else t["agents"]
                for key in keys:
                    for rid, text, deleted in db.execute(query, (key,)):
                        store = table + (" (soft-deleted)" if deleted else "")
                        items.append({"store": store, "id": str(rid), "text": str(text or "")})
        finally:
            db.close()
        return {"items": items}


def main() -> None:
    ap = arguments(
        __doc__,
        9006,
        "letta-agent-data",
        "the Letta server's home and files",
        forgets={
            "letta": "the human block without the lines that carry the target (blocks.modify), the "
            "archival passages that carry it deleted, the messages of every agent whose history carries it "
            "reset",
        },
    )
    ap.add_argument(
        "--letta-port", type=int, default=8283, help="where the Letta server this script starts listens"
    )
    ap.add_argument(
        "--max-steps",
        type=int,
        default=4,
        help="Letta's own cap on the steps of one turn (max_steps): a model that cannot drive Letta's tools "
        "(it calls tools Letta lacks) ends its turn, unanswered, instead of looping until a timeout",
    )
    args = ap.parse_args()
    agent = LettaAgent(
        args.data, args.model, forget=args.forget, letta_port=args.letta_port, max_steps=args.max_steps
    )
    # uvicorn re-raises the SIGTERM it shut down on; with the default action the process would die there,
    # before the `finally`, and leave the Letta server running on its port
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        serve_agent(agent, "letta-agent", args.port, title="Letta reference agent", tenant_model_url=True)
    finally:
        agent.stop_server()


if __name__ == "__main__":
    main()
