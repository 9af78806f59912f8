"""The canonical schedule, written once (``eu_audit.engines.base`` says why it makes states exact).

``Schedule`` holds what every engine does the same way: a model turn (decode, then commit the finished
turn as one segment), branches of a state (run continuations, come back by a crop) and one-by-one
branches. ``LocalEngine`` adds the schedule of an engine that holds the cache itself: prefill, decode token
by token, commit, crop, reset, all over four primitives a backend implements:

* ``_run(ids)``: one forward pass of ``ids`` after the cache's tokens; the last id's logits;
* ``_drop(offset)``: remove the cache's positions ``offset..``;
* ``_clear()``: empty the cache;
* ``_facts()`` (through ``facts``): what its states depend on.

Adding an engine is implementing those (and ``open``, ``sibling``); a served engine, whose forward passes
happen on a server, implements ``prefill``, ``decode``, ``crop`` and ``commit`` over requests instead and
keeps the rest of ``Schedule``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from eu_audit.engines.base import Abilities, Branch, Sampling, TokenAccount
from eu_audit.errors import BadInput, RunFailed
from eu_audit.models import LoadedModel

if TYPE_CHECKING:  # torch loads with the first pick: a command refused on its input never pays for it
    import torch

    from eu_audit.engines.constraint import Constraint


class Schedule:
    """The turn and branch rules every engine shares; an engine subclasses this (or ``LocalEngine``)."""

    name: ClassVar[str] = ""
    abilities: ClassVar[Abilities] = Abilities()
    account: TokenAccount
    loaded: LoadedModel
    tokenizer: Any
    reuse_reported: bool = True

    # -- how a recorded run opens it again (class-level: before any model loads) ------------------------
    @classmethod
    def reopen_options(cls, facts: Mapping[str, Any], *, server: str | None = None) -> dict[str, Any]:
        """The options (``open_engine``'s) that open this engine again as a run recorded it, from the
        bundle's engine facts; ``server`` is a URL the user gave for a served engine."""
        return {}

    @classmethod
    def context_options(cls, n_ctx: int) -> dict[str, Any]:
        """The options that size this engine's context to ``n_ctx`` tokens (``--ctx``); refused by an
        engine whose context is not ours to size (the model's own, or the server's)."""
        raise BadInput(f"--ctx sizes the llamacpp engine's context; the {cls.name} engine holds its own")

    @classmethod
    def weights_digest_unloaded(cls, model: str) -> str | None:
        """The digest of ``model``'s weights as this engine loads them, read without loading them, so a
        wrong ``--model`` is refused first; None where only loading can tell."""
        return None

    # -- what a subclass provides -----------------------------------------------------------------
    @property
    def offset(self) -> int:
        raise NotImplementedError

    def prefill(self, ids: Sequence[int]) -> None:
        raise NotImplementedError

    def crop(self, offset: int) -> None:
        raise NotImplementedError

    def commit(self, start: int, ids: Sequence[int]) -> None:
        raise NotImplementedError

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
        raise NotImplementedError

    def _mark(self) -> Any:
        """What a branch must put back besides the tokens (a local engine: the state's last logits)."""
        return None

    def _restore_mark(self, mark: Any) -> None:
        return None

    # -- the shared rules ---------------------------------------------------------------------------
    @property
    def max_segment(self) -> int | None:
        return None

    @property
    def vocab_size(self) -> int:
        config = getattr(self.loaded.model, "config", None)  # a transformers config, where there is one
        return int(getattr(config, "vocab_size", 0) or len(self.tokenizer))

    @property
    def context_size(self) -> int:
        config = getattr(self.loaded.model, "config", None)
        return int(getattr(config, "max_position_embeddings", 0) or 2048)

    def generate_turn(
        self,
        *,
        prefix_ids: Sequence[int],
        max_tokens: int,
        stop_ids: Sequence[int],
        closing_ids: Sequence[int],
        closing_after_stop: Sequence[int],
        sampling: Sampling,
    ) -> list[int]:
        """One model turn under the canonical schedule; returns the committed ids of the turn: forced
        prefix + generated ids + the closing marker the chat format needs."""
        start = self.offset
        gen = self.decode(max_tokens=max_tokens, stop_ids=stop_ids, sampling=sampling, prefix_ids=prefix_ids)
        ended = bool(gen) and gen[-1] in set(stop_ids)
        turn = [*prefix_ids, *gen, *(closing_after_stop if ended else closing_ids)]
        self.commit(start, turn)
        return turn

    @contextlib.contextmanager
    def branch(self) -> Iterator[None]:
        """Run continuations from the current state, then come back to it by a crop."""
        start, mark = self.offset, self._mark()
        try:
            yield
        finally:
            self.crop(start)
            self._restore_mark(mark)

    def run_branches(self, branches: Sequence[Branch], stop_ids: Sequence[int]) -> list[list[int]]:
        """Every branch's decoded ids (a final stop id included); the state is unchanged afterwards."""
        return self.branches_one_by_one(branches, stop_ids)

    def branches_one_by_one(self, branches: Sequence[Branch], stop_ids: Sequence[int]) -> list[list[int]]:
        """Branches run one after another, a first segment that consecutive branches share prefilled once
        (cropping back to it is restoring it)."""
        out: list[list[int]] = []
        i = 0
        while i < len(branches):
            first = branches[i].segments[:1]
            j = i
            while j < len(branches) and branches[j].segments[:1] == first:
                j += 1
            with self.branch():
                for seg in first:
                    self.prefill(seg)
                for b in branches[i:j]:
                    with self.branch():
                        rest = b.segments[1:]
                        for seg in rest[:-1]:
                            self.prefill(seg)
                        out.append(
                            self.decode(
                                max_tokens=b.max_tokens,
                                stop_ids=stop_ids,
                                sampling=b.sampling,
                                prefix_ids=rest[-1] if rest else (),
                            )
                        )
            i = j
        return out

    def excise(self, ranges: Sequence[tuple[int, int]]) -> None:
        raise BadInput(f"engine '{self.name}' holds no KV tensors to excise from (use --engine hf)")

    def kv_tensors(self) -> dict[str, Any]:
        raise BadInput(f"engine '{self.name}' holds no KV tensors (use --engine hf)")


def pick(logits: Any, sampling: Sampling, gen: torch.Generator | None) -> int:
    """The next id: argmax at temperature 0, else one draw from softmax(logits / temperature)."""
    import torch

    scores = torch.as_tensor(logits)
    if sampling.temperature == 0:
        return int(torch.argmax(scores))
    probs = torch.softmax(scores / sampling.temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen))


def generator(sampling: Sampling) -> torch.Generator | None:
    """The seeded generator a sampled decode draws from (None when greedy)."""
    import torch

    return torch.Generator().manual_seed(int(sampling.seed or 0)) if sampling.temperature > 0 else None


class LocalEngine(Schedule):
    """An engine that holds its cache: the canonical schedule over ``_run``, ``_drop`` and ``_clear``."""

    abilities: ClassVar[Abilities] = Abilities(exact=True)

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.account = TokenAccount()
        self._tokens: list[int] = []
        self._last_logits: Any = None

    # -- the primitives a backend implements ------------------------------------------------------
    def _run(self, ids: Sequence[int]) -> Any:
        """One forward pass of ``ids`` placed after the cache's tokens; returns the last id's logits."""
        raise NotImplementedError

    def _drop(self, offset: int) -> None:
        """Remove the cache's positions ``offset..`` (``offset`` < the cache's length)."""
        raise NotImplementedError

    def _clear(self) -> None:
        raise NotImplementedError

    # -- state --------------------------------------------------------------------------------------
    @property
    def offset(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> list[int]:
        return list(self._tokens)

    def reset(self) -> None:
        self._clear()
        self._tokens = []
        self._last_logits = None

    def _mark(self) -> Any:
        return self._last_logits

    def _restore_mark(self, mark: Any) -> None:
        self._last_logits = mark

    def _forward(self, ids: Sequence[int]) -> Any:
        logits = self._run(ids)
        self._tokens.extend(int(t) for t in ids)
        self.account.forwards += 1
        self._last_logits = logits
        return logits

    def _truncate(self, offset: int) -> None:
        if not 0 <= offset <= self.offset:
            raise ValueError(f"cannot crop to {offset}: the cache holds {self.offset} tokens")
        if offset < self.offset:
            self._drop(offset)
            del self._tokens[offset:]
        self._last_logits = None  # logits belong to the dropped position; a prefill comes next

    # -- the schedule -------------------------------------------------------------------------------
    def prefill(self, ids: Sequence[int]) -> None:
        """Run one segment through the model as a single chunk."""
        if not ids:
            return
        self._forward(ids)
        self.account.prefilled += len(ids)

    def crop(self, offset: int) -> None:
        """Restore the state that held the first ``offset`` tokens (a segment start). O(1) in compute."""
        self._truncate(offset)
        self.account.reused += offset

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
        """Decode token by token after an optional forced prefix; returns the new ids (a final stop id
        included). The state is left token-by-token: ``commit`` makes it canonical. A ``constraint``
        (structured output) masks the ids it forbids before each pick."""
        if prefix_ids:
            self.prefill(prefix_ids)
        logits = self._last_logits
        if logits is None:
            raise RunFailed("decode needs a prefilled segment first (the state ends at a crop point)")
        gen = generator(sampling)
        stops = set(stop_ids)
        out: list[int] = []
        for i in range(max_tokens):
            if constraint is not None:
                logits = constraint.restrict(logits)
            tok = pick(logits, sampling, gen)
            if constraint is not None:
                constraint.accept(tok)
            out.append(tok)
            if tok in stops or i == max_tokens - 1 or (stop_early is not None and stop_early(out)):
                break  # the last id is not fed here: commit feeds the whole turn
            logits = self._forward([tok])
        self.account.decoded += len(out)
        return out

    def commit(self, start: int, ids: Sequence[int]) -> None:
        """Make the turn canonical: crop to its start, prefill its ids as one chunk."""
        self._truncate(start)
        self._forward(ids)
        self.account.prefilled += len(ids)
