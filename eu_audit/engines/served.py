"""The ``openai`` engine: a ``KVEngine`` over an OpenAI-compatible server's ``/v1/completions`` with
token-id prompts (vLLM, SGLang, llama.cpp's server), for runs at a scale one CPU cannot give.

- The state is the client-side token list. ``prefill`` appends a segment (nothing is sent); the next
  generation request sends the whole prefix, and the server's prefix cache decides what it recomputes.
  ``crop`` truncates the list: restore is re-sending the clean prefix.
- Reuse is read from the server: ``usage.prompt_tokens_details.cached_tokens`` (vLLM with
  ``--enable-prompt-tokens-details``, SGLang with ``--enable-cache-report``) or llama.cpp's
  ``timings.cache_n``. A server that does not report it leaves reuse *unknown* (``None`` in the ledger),
  never 0.
- Exactness is measured, not assumed: a server decodes the turn on the KV it holds, not under eu-audit's
  canonical schedule, so B7 == B5 holds token for token only where the server is batch-invariant
  (vLLM ``VLLM_BATCH_INVARIANT=1``, SGLang ``--enable-deterministic-inference``) or, on a CPU llama.cpp
  server, where its token path is deterministic. The tests and ``bench/served_exactness.py`` measure it
  on the returned token ids.

The engine also speaks to the serving layer's own state: ``reset_cache`` (llama.cpp slot erase, vLLM
``/reset_prefix_cache``, SGLang ``/flush_cache``) and ``cached_tokens_for`` (one request, one token),
which the serving-residue audit uses.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from eu_audit.engines.base import ENGINES, Abilities, Sampling, TokenAccount
from eu_audit.engines.schedule import Schedule
from eu_audit.errors import BadInput, RunFailed
from eu_audit.http import HttpFailure, request_json
from eu_audit.models import MODELS, LoadedModel, load_model

if TYPE_CHECKING:
    from eu_audit.engines.constraint import Constraint

SERVER_ENV = "EU_AUDIT_SERVER"  # the server's base URL when --server is not given
DIALECTS = ("llamacpp", "vllm", "sglang", "eu-audit", "openai")


def served_model(url: str) -> str | None:
    """The registered model a server lists first at ``/v1/models`` (eu-audit serve lists the one it runs);
    None when it lists none that eu-audit knows."""
    listed = Server(url).probe("/v1/models")
    if isinstance(listed, dict) and listed.get("data"):
        name = str(listed["data"][0].get("id"))
        return name if name in MODELS.names() else None
    return None


class Server:
    """An OpenAI-compatible server's base URL; every failure to reach it is a failed run (exit 3)."""

    def __init__(self, base_url: str, *, timeout: float = 600.0, api_key: str | None = None) -> None:
        url = base_url.rstrip("/")
        if url.endswith("/v1"):
            url = url[: -len("/v1")]
        if not url.startswith(("http://", "https://")):
            raise BadInput(f"server URL '{base_url}' must start with http:// or https://")
        self.url, self.timeout = url, timeout
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY")

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        try:
            return request_json(self.url + path, method, body, timeout=self.timeout, headers=headers)
        except HttpFailure as exc:
            raise RunFailed(str(exc)) from None

    def probe(self, path: str) -> Any | None:
        with contextlib.suppress(RunFailed):
            return self.request("GET", path)
        return None


class SlotState:
    """What one server slot holds, shared by every engine that uses the slot (a session and its isolated
    sub-tasks, or sessions that share a slot): the canonical segments, whether decode-time tokens follow
    them, and a lock held for a whole exchange, so no other engine interleaves its requests."""

    _all: ClassVar[dict[tuple[str, int | None], SlotState]] = {}
    _guard: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self.held: list[list[int]] | None = None  # None: unknown (erase before use)
        self.dirty = False
        self.lock = threading.RLock()

    @classmethod
    def of(cls, url: str, slot: int | None) -> SlotState:
        with cls._guard:
            return cls._all.setdefault((url, slot), cls())


def _usage_counts(resp: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    """(prompt tokens processed, prompt tokens reused from the cache, completion tokens) as the server
    reports them; None where it does not."""
    timings = resp.get("timings") or {}
    usage = resp.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None and "cache_n" in timings:
        cached = timings.get("cache_n")
    prompt = usage.get("prompt_tokens")
    if "prompt_n" in timings and timings.get("cache_n") is not None:
        prompt = int(timings["prompt_n"]) + int(timings["cache_n"])  # llama.cpp: prompt_n excludes the cache
    completion = usage.get("completion_tokens", timings.get("predicted_n"))
    return (
        None if prompt is None else int(prompt),
        None if cached is None else int(cached),
        None if completion is None else int(completion),
    )


def _returned_ids(choice: dict[str, Any], resp: dict[str, Any]) -> list[int] | None:
    for key in ("token_ids", "tokens"):  # vLLM/SGLang return_token_ids; llama.cpp return_tokens
        ids = choice.get(key, resp.get(key))
        if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
            return [int(i) for i in ids]
    return None


@ENGINES.register("openai")
class OpenAIEngine(Schedule):
    """One session's state on a served model: its segments, client side. Turns and branches follow the
    shared schedule; a forward pass is a request."""

    name = "openai"
    #: sessions may run in parallel threads, each with its own engine (and slot); exactness is measured
    abilities: ClassVar[Abilities] = Abilities(concurrent_sessions=True)

    def __init__(
        self,
        loaded: LoadedModel,
        server: Server,
        *,
        model_id: str | None = None,
        dialect: str | None = None,
        schedule: str | None = None,
        id_slot: int | None = None,
        info: dict[str, Any] | None = None,
    ) -> None:
        self.loaded, self.tokenizer, self.server = loaded, loaded.tokenizer, server
        self.account = TokenAccount()
        self.reuse_reported = True  # False once a response omitted its cached-token count
        self.exact_ids = True  # False when a response returned no token ids (text re-tokenised)
        info = info if info is not None else self._server_info()
        self.server_facts = info
        self.model_id = model_id or info.get("model_id") or loaded.name
        served = str(info.get("model_id") or "")
        if served != loaded.name and served in MODELS.names():
            # token-id prompts: another model's tokenizer would send the server other words, silently
            raise BadInput(
                f"{server.url} serves {served}, but this engine tokenizes with {loaded.name}'s tokenizer: "
                f"its token ids would be other words to {served}; use --model {served}"
            )
        self.dialect = dialect or info.get("dialect") or "openai"
        if self.dialect not in DIALECTS:
            raise BadInput(f"unknown server dialect '{self.dialect}' (known: {', '.join(DIALECTS)})")
        self.schedule = schedule or ("canonical" if self.dialect == "llamacpp" else "plain")
        if self.schedule == "canonical" and self.dialect != "llamacpp":
            raise BadInput("the canonical served schedule needs a llama.cpp server (slot truncation)")
        self.id_slot = id_slot if id_slot is not None else (0 if self.dialect == "llamacpp" else None)
        self.slot = SlotState.of(server.url, self.id_slot)
        self._segs: list[list[int]] = []  # the session's state, segment by segment
        self._restored = True  # the next request's cached tokens are what a restore kept (reuse)

    @classmethod
    def reopen_options(cls, facts: Mapping[str, Any], *, server: str | None = None) -> dict[str, Any]:
        """Back to a server: the one given, else ``EU_AUDIT_SERVER``, else the one the run recorded."""
        recorded = (facts.get("server") or {}).get("base_url")
        return {"server": server or os.environ.get(SERVER_ENV) or recorded}

    @classmethod
    def open(
        cls, model: str, *, dtype: str = "gguf", loaded: LoadedModel | None = None, **options: Any
    ) -> OpenAIEngine:
        url = options.get("server") or os.environ.get(SERVER_ENV)
        if not url:
            raise BadInput(f"the openai engine needs the server's URL: --server URL (or {SERVER_ENV})")
        tok_model = loaded if loaded is not None else load_model(model, tokenizer_only=True)
        return cls(
            tok_model,
            Server(str(url)),
            model_id=options.get("model_id"),
            dialect=options.get("dialect"),
            schedule=options.get("schedule"),
        )

    def _server_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"base_url": self.server.url}
        models = self.server.probe("/v1/models")
        if isinstance(models, dict) and models.get("data"):
            info["model_id"] = str(models["data"][0].get("id"))
        props = self.server.probe("/props")
        # serve.control.INFO_ROUTE, written out: engines never import serve (serve is built on engines)
        ours = self.server.probe("/eu-audit/v1/info")
        if isinstance(ours, dict) and "weight_digest" in ours:
            info["dialect"] = "eu-audit"  # eu-audit serve: keeps the canonical schedule given segments
            info["props"] = {k: ours[k] for k in ("version", "model", "weight_digest", "engine") if k in ours}
        elif isinstance(props, dict) and ("default_generation_settings" in props or "total_slots" in props):
            info["dialect"] = "llamacpp"
            keep = ("total_slots", "build_info", "model_path", "endpoint_slots")
            info["props"] = {k: props[k] for k in keep if k in props}
        elif self.server.probe("/version") is not None:
            info["dialect"] = "vllm"
        elif self.server.probe("/get_server_info") is not None:
            info["dialect"] = "sglang"
        if info.get("model_id") is None:
            raise RunFailed(
                f"{self.server.url} does not list a model at /v1/models: is it an OpenAI-compatible server?"
            )
        return info

    # -- state ---------------------------------------------------------------------------------
    @property
    def offset(self) -> int:
        return sum(map(len, self._segs))

    @property
    def tokens(self) -> list[int]:
        return [i for seg in self._segs for i in seg]

    def facts(self) -> dict[str, Any]:
        return {
            "library": "OpenAI-compatible server, token-id prompts (llama.cpp: its native /completion)",
            "server": self.server_facts,
            "model_id": self.model_id,
            "dialect": self.dialect,
            "schedule": self.schedule,
            "reuse": "reported" if self.reuse_reported else "unknown (the server does not report it)",
            "token_ids": "returned by the server" if self.exact_ids else "re-tokenised from text",
        }

    def reset(self) -> None:
        self._segs = []
        self._restored = True

    def sibling(self, id_slot: int | None = None) -> OpenAIEngine:
        """Another session on the same server: on ``id_slot`` when given, else on the next slot (an
        isolated sub-task then leaves the session's slot alone; with one slot they share it, correctly
        but with more recomputation)."""
        if id_slot is None and self.id_slot is not None:
            id_slot = (self.id_slot + 1) % self.slots
        side = OpenAIEngine(
            self.loaded,
            self.server,
            model_id=self.model_id,
            dialect=self.dialect,
            schedule=self.schedule,
            id_slot=id_slot,
            info=self.server_facts,
        )
        side.account = self.account
        return side

    @property
    def slots(self) -> int:
        return int(self.server_facts.get("props", {}).get("total_slots", 1) or 1)

    def prefill(self, ids: Sequence[int]) -> None:
        if ids:
            self._segs.append([int(i) for i in ids])

    def crop(self, offset: int) -> None:
        if not 0 <= offset <= self.offset:
            raise ValueError(f"cannot crop to {offset}: the state holds {self.offset} tokens")
        kept, pos = [], 0
        for seg in self._segs:
            if pos + len(seg) <= offset:
                kept.append(seg)
            elif pos < offset:
                kept.append(seg[: offset - pos])  # off the schedule; never happens at segment starts
            pos += len(seg)
        self._segs = kept
        self._restored = True

    def commit(self, start: int, ids: Sequence[int]) -> None:
        """The turn as one segment (the next request sends it as one batch)."""
        self.crop(start)
        self.prefill(ids)

    # -- requests ------------------------------------------------------------------------------
    def _native(self, prompt: Sequence[int], n_predict: int, sampling: Sampling) -> dict[str, Any]:
        """llama.cpp's /completion on a token prompt, pinned to this engine's slot."""
        body: dict[str, Any] = {
            "prompt": list(prompt),
            "n_predict": n_predict,
            "return_tokens": True,
            "cache_prompt": True,
            "temperature": sampling.temperature,
            # plain softmax sampling at the temperature: no top-k / top-p / min-p truncation
            "top_k": 1 if sampling.temperature == 0 else 0,
            "top_p": 1.0,
            "min_p": 0.0,
            "id_slot": self.id_slot,
        }
        if sampling.temperature > 0:
            body["seed"] = int(sampling.seed or 0)
        resp = self.server.request("POST", "/completion", body)
        if "tokens" not in resp:
            raise RunFailed(f"{self.server.url}/completion answered without tokens: {str(resp)[:200]}")
        return dict(resp)

    def _openai(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        sampling: Sampling,
        stop_ids: Sequence[int],
        segments: Sequence[int] | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        body: dict[str, Any] = {
            "model": self.model_id,
            "prompt": list(prompt),
            "max_tokens": max_tokens,
            "temperature": sampling.temperature,
            "top_p": 1.0,
            "return_token_ids": True,  # vLLM / SGLang
        }
        if sampling.temperature > 0:
            body["seed"] = int(sampling.seed or 0)
        else:
            body["top_k"] = 1  # greedy wherever temperature 0 alone is not taken as greedy
        if stop_ids:
            body["stop_token_ids"] = list(stop_ids)
        if segments is not None and self.dialect == "eu-audit":
            body["segments"] = list(segments)  # eu-audit serve prefills each as one chunk
        resp = self.server.request("POST", "/v1/completions", body)
        choices = resp.get("choices") or []
        if not choices:
            raise RunFailed(f"{self.server.url}/v1/completions answered without choices: {str(resp)[:200]}")
        return choices[0], resp

    def _count(self, resp: dict[str, Any], *, reuse: bool, decoded: int | None = None) -> None:
        """Account one request. Reuse is what the server kept for the first request after a restore (a
        crop or a reset), like a local engine's crop; later requests only extend the session's own
        state, whose cached prefix is not reuse."""
        prompt_n, cached, _ = _usage_counts(resp)
        if cached is None:
            self.reuse_reported = False
        elif reuse and self._restored:
            self.account.reused += cached
            self._restored = False
        processed = (prompt_n - cached) if prompt_n is not None and cached is not None else prompt_n
        self.account.prefilled += max(0, processed or 0)
        if decoded is not None:
            self.account.decoded += decoded
        self.account.forwards += 1

    # -- the canonical served schedule (llama.cpp) -------------------------------------------
    def _erase(self) -> None:
        try:
            self.server.request("POST", f"/slots/{self.id_slot}?action=erase", {})
        except RunFailed as exc:
            raise RunFailed(
                f"{exc}; the canonical served schedule erases its slot: start llama.cpp's server with "
                "--slots --slot-save-path DIR (slot actions), or record with the plain schedule"
            ) from None
        self.slot.held, self.slot.dirty = [], False

    def _sync(self) -> None:
        """Make the slot hold exactly the session's segments, each computed as one batch and then its last
        token evaluated again alone (what llama.cpp does whenever a prompt is fully cached): the KV the
        server holds is then a function of the segment ids alone, whatever the slot held before, so a
        replay from a crop and a fresh run meet bit for bit."""
        slot = self.slot
        if slot.held is None:
            self._erase()
        held = slot.held or []
        k = 0
        while k < min(len(held), len(self._segs)) and held[k] == self._segs[k]:
            k += 1
        if k < len(held) or slot.dirty:
            if k == 0:
                self._erase()
            else:  # keep the first k segments: a fully cached prompt truncates the slot there
                self._native([i for seg in self._segs[:k] for i in seg], 0, Sampling())
                slot.held, slot.dirty = [list(s) for s in self._segs[:k]], False
        prefix: list[int] = [i for seg in self._segs[:k] for i in seg]
        for seg in self._segs[k:]:
            prefix += seg
            self._count(self._native(prefix, 0, Sampling()), reuse=True)  # the segment, one batch
            self._count(self._native(prefix, 0, Sampling()), reuse=False)  # its last token, alone
            assert slot.held is not None
            slot.held.append(list(seg))

    # -- generation ----------------------------------------------------------------------------
    def complete(
        self,
        prompt: Sequence[int],
        *,
        max_tokens: int,
        sampling: Sampling,
        stop_ids: Sequence[int] = (),
        segments: Sequence[int] | None = None,
    ) -> tuple[list[int], dict[str, Any]]:
        """One generation request on a token-id prompt; returns (generated ids, raw response). In the
        canonical schedule the slot then holds decode-time tokens (``SlotState.dirty``)."""
        if self.dialect == "llamacpp":
            resp = self._native(prompt, max_tokens, sampling)
            choice: dict[str, Any] = {"tokens": resp["tokens"]}
            self.slot.dirty = True
        else:
            choice, resp = self._openai(prompt, max_tokens, sampling, stop_ids, segments)
        ids = _returned_ids(choice, resp)
        if ids is None:
            self.exact_ids = False
            ids = list(self.tokenizer(choice.get("text", ""), add_special_tokens=False)["input_ids"])
        self._count(resp, reuse=self.schedule == "plain", decoded=len(ids))
        return ids, resp

    def decode(
        self,
        *,
        max_tokens: int,
        stop_ids: Sequence[int],
        sampling: Sampling,
        prefix_ids: Sequence[int] = (),
        stop_early: Callable[[Sequence[int]], bool] | None = None,
        constraint: Constraint | None = None,
    ) -> list[int]:
        """Generate after the state and a forced prefix; the state is left holding the prefix."""
        if constraint is not None:  # the server samples; a mask per token would be a request per token
            raise BadInput("structured output (response_format) needs a local engine: llamacpp or hf")
        with self.slot.lock:  # the whole exchange: no other engine's request lands on the slot between
            if self.schedule == "canonical":
                self._sync()
            prompt = [*self.tokens, *prefix_ids]
            segments = [len(seg) for seg in self._segs] + ([len(prefix_ids)] if prefix_ids else [])
            ids, resp = self.complete(
                prompt, max_tokens=max_tokens, sampling=sampling, stop_ids=stop_ids, segments=segments
            )
        self.prefill(prefix_ids)
        stops = set(stop_ids)
        finish = (resp.get("choices") or [{}])[0].get("finish_reason") or resp.get("stop_type")
        if ids and ids[-1] in stops:
            return ids
        if finish in ("stop", "eos") and len(ids) < max_tokens and stop_ids:
            return [*ids, stop_ids[0]]  # the server stopped at end-of-generation without returning it
        return ids

    # -- the serving layer's own state ---------------------------------------------------------
    def cached_tokens_for(self, prompt: Sequence[int]) -> int | None:
        """How many of ``prompt``'s tokens the server serves from its cache (one request, one token).
        None when the server does not report it. Not part of any method's cost."""
        saved = (self.account.copy(), self.reuse_reported)
        with self.slot.lock:
            _, resp = self.complete(prompt, max_tokens=1, sampling=Sampling())
            self.slot.held = None  # the slot now holds the probe: resynchronise from scratch next time
        self.account, self.reuse_reported = saved
        return _usage_counts(resp)[1]

    def reset_cache(self) -> str:
        """The server's own cache reset; returns what was called."""
        with SlotState._guard:
            for state in SlotState._all.values():
                state.held = None
        if self.dialect == "llamacpp":
            slots = self.server.request("GET", "/slots")
            ids = [s.get("id", i) for i, s in enumerate(slots)] if isinstance(slots, list) else [0]
            for sid in ids:
                self.server.request("POST", f"/slots/{sid}?action=erase", {})
            return f"POST /slots/{{id}}?action=erase for slots {ids}"
        if self.dialect == "sglang":
            self.server.request("POST", "/flush_cache", {})
            return "POST /flush_cache"
        self.server.request("POST", "/reset_prefix_cache", {})
        return "POST /reset_prefix_cache"
