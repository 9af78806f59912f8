"""What every engine is: the types its schedule speaks in (accounting, sampling, branches), the abilities
it declares, the protocol the runtime, replay, methods and audits call, and the registry that opens one
by name.

Exactness rests on one rule, the *canonical schedule* (``eu_audit.engines.schedule`` writes it once): a
position's KV values depend on how many tokens shared its forward pass (measured: a one-shot prefill of a
whole transcript differs from a segment-wise one by 1e-5..7e-5). So an engine only ever materialises state
one *segment* at a time:

* an observation (system prompt, memory, user message, tool result) is prefilled as one chunk;
* a model turn is decoded token by token and then *committed*: the engine crops back to the turn's start
  and prefills the finished turn as one chunk.

After every segment the cache therefore equals "each segment prefilled as one chunk, in order", a state
that depends only on the segment token ids. Cropping at a segment start and prefilling the same segments
again is bitwise identical to a fresh run, and a turn whose text is fixed can be re-materialised by one
prefill (what selective replay does for content fixed in the counterfactual world).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from eu_audit.defaults import DTYPE
from eu_audit.models import LoadedModel
from eu_audit.registry import Registry

if TYPE_CHECKING:
    from eu_audit.engines.constraint import Constraint


@dataclass
class TokenAccount:
    """Tokens run through the model, by kind; ``reused`` counts cached tokens kept by a restore."""

    prefilled: int = 0
    decoded: int = 0
    reused: int = 0
    forwards: int = 0

    def copy(self) -> TokenAccount:
        return TokenAccount(**{f.name: getattr(self, f.name) for f in fields(self)})

    def since(self, earlier: TokenAccount) -> TokenAccount:
        return TokenAccount(
            **{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)}
        )


@dataclass(frozen=True)
class Sampling:
    """Greedy at temperature 0; otherwise sampling from softmax(logits / temperature) with ``seed``."""

    temperature: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if self.temperature > 0 and self.seed is None:
            raise ValueError("sampling needs an explicit seed (reproducibility is part of the contract)")


@dataclass(frozen=True)
class Branch:
    """One continuation of a state: segments prefilled one forward pass each (none: continue from the
    state's last logits), then up to ``max_tokens`` ids decoded under ``sampling``."""

    segments: tuple[tuple[int, ...], ...]
    max_tokens: int
    sampling: Sampling = Sampling()


@dataclass(frozen=True)
class Abilities:
    """What an engine can do beyond the protocol, declared once on its class and read by name nowhere
    else. Methods name the ability they need (``MethodSpec.needs``), so a check before any compute can
    refuse a method its engine cannot run."""

    #: the cache is computed locally under the canonical schedule: a state is a function of its segment
    #: ids, so B7 == B5 token for token is a claim the engine can make (served engines measure it)
    exact: bool = False
    #: ``run_branches`` decodes a state's branches together as one batch per step (sampled branches then
    #: differ from one-by-one ones: an audit never resumes one kind with the other)
    batched_branches: bool = False
    #: ``excise`` deletes positions from the middle of the cache (span-only excision, B6)
    excise: bool = False
    #: ``kv_tensors`` returns the cache as named tensors (``record --kv-sidecar``)
    kv_tensors: bool = False
    #: sessions may run in parallel threads, each on its own ``sibling`` (``record --concurrency``)
    concurrent_sessions: bool = False

    def named(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name)]


#: the abilities a method may need, each with the words a refusal uses
ABILITY_NAMES = tuple(f.name for f in fields(Abilities))


class KVEngine(Protocol):
    """What the agent runtime, replay, methods and audits need from an engine. Kept narrow on purpose so
    that a served engine (where restore means re-sending the clean prefix) can implement it too. Every
    engine follows the canonical schedule: ``prefill`` runs one segment as one chunk, ``generate_turn``
    decodes token by token and commits the turn as one chunk, ``crop`` restores the state that held the
    first ``offset`` tokens."""

    name: ClassVar[str]
    abilities: ClassVar[Abilities]
    account: TokenAccount
    loaded: LoadedModel  # the model's identity (name, digests, dtype); ``.model`` is None off HF
    tokenizer: Any  # a Hugging Face tokenizer of the engine's model: text <-> ids
    #: False once the engine could not learn how many tokens a restore kept (a server that does not say)
    reuse_reported: bool

    @property
    def offset(self) -> int: ...

    @property
    def tokens(self) -> list[int]: ...

    @property
    def context_size(self) -> int:
        """Positions the model can hold in this engine."""
        ...

    @property
    def max_segment(self) -> int | None:
        """The longest segment one forward pass takes (None: no limit below the context)."""
        ...

    @property
    def vocab_size(self) -> int: ...

    def facts(self) -> dict[str, Any]:
        """What the engine's states depend on (library versions, threads, batch sizes, cache type):
        recorded in the bundle header, so a replay can tell it runs under the same conditions."""
        ...

    def reset(self) -> None: ...

    def prefill(self, ids: Sequence[int]) -> None: ...

    def decode(
        self,
        *,
        max_tokens: int,
        stop_ids: Sequence[int],
        sampling: Sampling,
        prefix_ids: Sequence[int] = (),
        stop_early: Callable[[Sequence[int]], bool] | None = None,
        constraint: Constraint | None = None,
    ) -> list[int]: ...

    def commit(self, start: int, ids: Sequence[int]) -> None: ...

    def generate_turn(
        self,
        *,
        prefix_ids: Sequence[int],
        max_tokens: int,
        stop_ids: Sequence[int],
        closing_ids: Sequence[int],
        closing_after_stop: Sequence[int],
        sampling: Sampling,
    ) -> list[int]: ...

    def crop(self, offset: int) -> None: ...

    def branch(self) -> contextlib.AbstractContextManager[None]: ...

    def run_branches(self, branches: Sequence[Branch], stop_ids: Sequence[int]) -> list[list[int]]: ...

    def sibling(self, id_slot: int | None = None) -> KVEngine:
        """A second, empty cache on the same model that accounts into this engine's account (isolated
        sub-tasks run there; a served engine may pin it to a server slot)."""
        ...

    def excise(self, ranges: Sequence[tuple[int, int]]) -> None: ...

    def kv_tensors(self) -> dict[str, Any]: ...


class EngineFactory(Protocol):
    name: ClassVar[str]
    abilities: ClassVar[Abilities]

    def reopen_options(self, facts: Mapping[str, Any], *, server: str | None = None) -> dict[str, Any]: ...

    def weights_digest_unloaded(self, model: str) -> str | None: ...

    def context_options(self, n_ctx: int) -> dict[str, Any]: ...

    def open(
        self, model: str, *, dtype: str, loaded: LoadedModel | None = None, **options: Any
    ) -> KVEngine: ...


#: engine name -> engine class; ``open_engine`` builds one on a model
ENGINES: Registry[Any] = Registry(
    "engines",
    builtins=("eu_audit.engines.hf", "eu_audit.engines.llamacpp", "eu_audit.engines.served"),
)
#: ``--engine auto``: llama.cpp for models shipped as GGUF (exact and faster), transformers otherwise
AUTO = "auto"


def abilities_of(name: str) -> Abilities:
    """The abilities engine ``name`` declares, without opening it (checks run before any compute)."""
    return factory_of(name).abilities


def is_exact(name: str) -> bool:
    """Whether engine ``name`` replays exactly (its ``Abilities.exact``): False for a name no installed
    engine has (a black-box run's, an engine whose plugin is gone)."""
    return name in ENGINES and abilities_of(name).exact


def factory_of(name: str) -> EngineFactory:
    """The engine class registered as ``name`` (``BadInput`` naming the known ones)."""
    factory: EngineFactory = ENGINES.get(name)
    return factory


def resolve_engine(name: str, model: str) -> str:
    """The engine ``auto`` means for ``model``: ``llamacpp`` when the model has a GGUF file and the
    llama.cpp wheel is installed, else ``hf``. Any other name is returned as is (validated)."""
    if name != AUTO:
        ENGINES.get(name)
        return name
    import importlib.util

    from eu_audit.models import has_gguf, resolve_model

    if has_gguf(resolve_model(model)) and importlib.util.find_spec("ik_llama_cpp") is not None:
        return "llamacpp"
    return "hf"


def open_engine(
    name: str,
    model: str,
    *,
    dtype: str = DTYPE,
    loaded: LoadedModel | None = None,
    **options: Any,
) -> KVEngine:
    """The engine ``name`` (or ``auto``) on ``model`` (a registered name, a local directory or a .gguf
    file). ``loaded`` reuses a model already loaded; ``options`` go to the engine (``server=URL``)."""
    factory: EngineFactory = ENGINES.get(resolve_engine(name, model))
    return factory.open(model, dtype=dtype, loaded=loaded, **options)
