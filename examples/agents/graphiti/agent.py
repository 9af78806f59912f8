"""A chat agent with tools whose memory is a Graphiti temporal knowledge graph on an embedded Kuzu
database, served over eu-audit's agent contract.

The shape Graphiti's documentation teaches: every exchange is added as an *episode*
(``Graphiti.add_episode``); Graphiti's LLM extracts entities (nodes, each with a summary) and facts
(edges), embeds them, and deduplicates them against the graph. Every turn the agent searches the graph
(``Graphiti.search``, hybrid BM25 + embeddings) for facts relevant to the message and puts them in the
system prompt. Its forget is Graphiti's documented deletion: ``remove_episode`` of every episode that
carries the target, which deletes the edges and nodes only that episode supports and rebuilds the
summaries of the nodes that remain. Its re-sync (the contract's ``reindex``) is Graphiti's
``build_communities``, which writes a summary per cluster of the entities that remain.

Nothing here imports eu-audit: it speaks the HTTP contract (``eu-audit schema agent-api``) and sends its
model calls and embeddings to an OpenAI-compatible endpoint (``OPENAI_BASE_URL``, e.g. ``eu-audit
serve``). Each tenant has a Kuzu database of its own and uses Graphiti's default group: graphiti-core
0.31.2 on Kuzu fails ``add_episode`` for any explicit ``group_id`` (``AttributeError: 'KuzuDriver'
object has no attribute '_database'``: ``Graphiti._resolve_request_scope`` reads an attribute only the
Neo4j and FalkorDB drivers set). Graphiti asks its LLM for structured output (JSON matching a schema);
when the model cannot give it, the turn fails with Graphiti's own error, which the harness reports with
the episode and step (exit 3).

    pip install -r examples/agents/graphiti/requirements.txt
    OPENAI_BASE_URL=http://127.0.0.1:8088/v1 \
        python examples/agents/graphiti/agent.py --port 9005 --data /tmp/graphiti-agent
"""

from __future__ import annotations

import asyncio
import datetime
import os
import re
import shutil
import sys
import threading
import uuid
import warnings
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from fastapi import HTTPException
from graphiti_core import Graphiti
from graphiti_core.cross_encoder.openai_reranker_client import OpenAIRerankerClient
from graphiti_core.driver.kuzu_driver import KuzuDriver
from graphiti_core.embedder.openai import OpenAIEmbedder, OpenAIEmbedderConfig
from graphiti_core.llm_client.config import LLMConfig
from graphiti_core.llm_client.openai_generic_client import OpenAIGenericClient
from graphiti_core.nodes import EpisodeType
from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the contract kit beside the agents
from contract_kit import (
    ForgetRequest,
    MemoryRecord,
    Message,
    StartSession,
    Tenants,
    actions,
    arguments,
    norm,
    serve_agent,
)

os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")  # no phone-home
warnings.filterwarnings("ignore", message="The Kuzu backend is deprecated")
SYSTEM = (
    "You are a personal assistant agent acting for one user. Be brief. Use the tools when a task needs "
    "them, and what you know about the user when it helps."
)
EMBED_DIMS = 384  # MiniLM, what eu-audit serve's /v1/embeddings returns
KEEP_MESSAGES = 8
_T = TypeVar("_T")


def _group(tenant: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", tenant)


class GraphitiAgent(Tenants):
    def __init__(self, data: Path, model: str, forget: str = "graphiti") -> None:
        super().__init__(data)
        data.mkdir(parents=True, exist_ok=True)
        self.data, self.model, self.forget_mode = data, model, forget
        self.graphs: dict[str, Graphiti] = {}
        self.loop = asyncio.new_event_loop()  # Graphiti is async: one loop for every call
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def wait(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    # --- plumbing ---------------------------------------------------------------------------------

    def folder(self, tenant: str) -> Path:
        return self.data / _group(tenant)

    def graph(self, tenant: str) -> Graphiti:
        if tenant not in self.graphs:
            base = self.bases.get(tenant, self.base)
            cfg = LLMConfig(api_key="none", model=self.model, small_model=self.model, base_url=base)
            embed = OpenAIEmbedderConfig(
                api_key="none", base_url=base, embedding_model="all-MiniLM-L6-v2", embedding_dim=EMBED_DIMS
            )
            folder = self.folder(tenant)
            folder.mkdir(parents=True, exist_ok=True)
            g = Graphiti(
                graph_driver=KuzuDriver(db=str(folder / "graph.kuzu")),
                llm_client=OpenAIGenericClient(config=cfg),
                embedder=OpenAIEmbedder(config=embed),
                cross_encoder=OpenAIRerankerClient(config=cfg),
            )
            self.wait(g.build_indices_and_constraints())
            self.graphs[tenant] = g
        return self.graphs[tenant]

    def graphiti(self, what: str, coro: Coroutine[Any, Any, _T]) -> _T:
        """A Graphiti call; its own error fails the turn, named."""
        try:
            return self.wait(coro)
        except Exception as exc:
            raise HTTPException(500, f"Graphiti's {what} failed: {type(exc).__name__}: {exc}") from exc

    def remember_text(self, tenant: str, name: str, body: str) -> str:
        g = self.graph(tenant)
        now = datetime.datetime.now(datetime.UTC)
        added = self.graphiti(
            "add_episode",
            g.add_episode(
                name=name, episode_body=body, source_description="chat with the user", reference_time=now,
                source=EpisodeType.message,
            ),
        )  # fmt: skip
        return str(added.episode.uuid)

    # --- a turn -----------------------------------------------------------------------------------

    def answer(self, s: dict[str, Any], facts: list[str]) -> dict[str, Any]:
        system = SYSTEM
        if facts:
            system += "\nWhat you know about the user:\n" + "\n".join(f"- {f}" for f in facts)
        window = s["history"][-KEEP_MESSAGES:]
        while window and window[0]["role"] == "tool":
            window = window[1:]
        client = OpenAI(base_url=self.bases.get(s["tenant"], self.base), api_key="none")
        kw: dict[str, Any] = {
            "model": self.model, "messages": [{"role": "system", "content": system}, *window],
            "temperature": 0.0, "max_tokens": 96,
        }  # fmt: skip
        if s["tools"]:
            kw["tools"] = s["tools"]
        msg = client.chat.completions.create(**kw).choices[0].message
        calls = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}  # noqa: E501
            for c in msg.tool_calls or []
        ]  # fmt: skip
        turn: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
        if calls:
            turn["tool_calls"] = calls
        s["history"].append(turn)
        return {"text": msg.content or "", "actions": actions(calls)}

    # --- the contract -----------------------------------------------------------------------------

    def start(self, body: StartSession) -> dict[str, Any]:
        if body.model_base_url and self.bases.get(body.tenant) != body.model_base_url:
            self.bases[body.tenant] = body.model_base_url
            old = self.graphs.pop(body.tenant, None)  # Graphiti's LLM and embedder follow the lane
            if old is not None:
                self.wait(old.close())
        sid = uuid.uuid4().hex[:12]
        with self.meta:
            self.sessions[sid] = {"tenant": body.tenant, "tools": body.tools, "history": [], "episodes": []}
        self.save_sessions(body.tenant)
        return {"session_id": sid}

    def send(self, sid: str, body: Message) -> dict[str, Any]:
        s = self.session(sid)
        calls = {c["id"] for m in s["history"] for c in m.get("tool_calls") or []}
        facts: list[str] = []
        if body.role == "tool" and body.tool_call_id in calls:
            s["history"].append({"role": "tool", "tool_call_id": body.tool_call_id, "content": body.content})
        elif body.role == "tool":
            s["history"].append({"role": "user", "content": f"Tool result ({body.name}): {body.content}"})
        else:
            g = self.graph(s["tenant"])
            found = self.graphiti("search", g.search(body.content, num_results=5))
            facts = [e.fact for e in found]
            s["history"].append({"role": "user", "content": body.content})
        turn = self.answer(s, facts)
        exchange = [m for m in s["history"][-2:] if m["role"] in ("user", "assistant") and m.get("content")]
        self.save_sessions(s["tenant"])
        if exchange:
            text = "\n".join(f"{m['role']}: {m['content']}" for m in exchange)
            s["episodes"].append(self.remember_text(s["tenant"], f"{sid}-{len(s['episodes'])}", text))
            self.save_sessions(s["tenant"])
        return turn

    def fork(self, sid: str) -> dict[str, Any]:
        return {"session_id": self.fork_session(sid)}

    def inject_memory(self, tenant: str, body: MemoryRecord) -> dict[str, Any]:
        self.remember_text(tenant, f"record-{body.id}", body.text)
        return {"text": "", "actions": []}

    def forget(self, tenant: str, body: ForgetRequest) -> dict[str, Any]:
        """Graphiti's deletion: ``remove_episode`` of every episode whose content carries the target.
        ``--forget none``: acknowledged, nothing removed (B0)."""
        if self.forget_mode == "none":
            return {"status": "ok", "detail": "forget disabled (--forget none)", "receipt": {"removed": []}}
        needles = [norm(v) for v in [body.target, *body.variants] if norm(v)]
        g = self.graph(tenant)
        now = datetime.datetime.now(datetime.UTC)
        episodes = self.graphiti("retrieve_episodes", g.retrieve_episodes(now, last_n=100_000))
        removed = [str(e.uuid) for e in episodes if any(n in norm(e.content) for n in needles)]
        for ep in removed:
            self.graphiti("remove_episode", g.remove_episode(ep))
        return {"status": "ok", "detail": f"removed {len(removed)} episodes", "receipt": {"removed": removed}}

    def reset(self, tenant: str) -> dict[str, Any]:
        g = self.graphs.pop(tenant, None)
        if g is not None:
            self.wait(g.close())
        shutil.rmtree(self.folder(tenant), ignore_errors=True)
        self.drop_sessions(tenant)
        return {"ok": True}

    def restart(self, tenant: str) -> dict[str, Any]:
        """What a process restart does to the tenant: Graphiti and its Kuzu database are closed and opened
        again from the file; the conversations are read back from disk."""
        g = self.graphs.pop(tenant, None)
        if g is not None:
            self.wait(g.close())
        self.load_sessions(tenant)
        return {"ok": True}

    def reindex(self, tenant: str) -> dict[str, Any]:
        """Graphiti's own re-sync: ``build_communities`` clusters the entities the graph still holds and
        has the LLM write a summary for each community (Graphiti's periodic maintenance job)."""
        g = self.graph(tenant)
        self.graphiti("build_communities", g.build_communities())
        return {"ok": True}

    def dump(self, tenant: str) -> dict[str, Any]:
        """Every text the graph keeps for the tenant (episodes, entity names and summaries, facts on
        edges, communities), and the conversations."""
        g = self.graph(tenant)
        queries = {
            "episodes": "MATCH (n:Episodic) RETURN n.uuid AS id, n.content AS text",
            "entities": "MATCH (n:Entity) "
            "RETURN n.uuid AS id, n.name + ': ' + n.summary AS text",
            "facts": "MATCH (n:RelatesToNode_) RETURN n.uuid AS id, n.fact AS text",
            "communities": "MATCH (n:Community) RETURN n.uuid AS id, n.summary AS text",
        }  # fmt: skip
        items: list[dict[str, Any]] = []
        for store, query in queries.items():
            records, _, _ = self.wait(g.driver.execute_query(query))
            items += [{"store": store, "id": str(r["id"]), "text": str(r["text"] or "")} for r in records]
        with self.meta:
            mine = [(sid, s) for sid, s in self.sessions.items() if s["tenant"] == tenant]
        for sid, s in mine:
            for i, msg in enumerate(s["history"]):
                items.append(
                    {"store": "conversation", "id": f"{sid}/{i}", "text": str(msg.get("content") or "")}
                )
        return {"items": items}


def main() -> None:
    ap = arguments(
        __doc__,
        9005,
        "graphiti-agent-data",
        "one Kuzu database per tenant",
        forgets={
            "graphiti": "remove_episode of every episode that carries the target",
        },
    )
    args = ap.parse_args()
    agent = GraphitiAgent(args.data, args.model, forget=args.forget)
    serve_agent(
        agent, "graphiti-kuzu-agent", args.port, title="Graphiti reference agent", tenant_model_url=True
    )


if __name__ == "__main__":
    main()
