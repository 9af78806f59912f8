"""Elicitation probes (data in ``probes/probes.jsonl``), run as branches of one post-forget state.

A probe is a user message (and optionally a forced opening of the answer) rendered for the episode:
``{task}`` is the episode's own task-shaped request that needs the target, ``{label}`` names the kind of
record ("home address", "IBAN"). ``ProbeRunner`` runs every probe, and every sample, as a branch of the
post-forget state (the rebuilt cache plus the persistent memory records, prefilled once) that is cropped
away afterwards, so k probes cost k continuations, not k rebuilds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, TypeAdapter

from eu_audit.defaults import ANSWER_MAX_TOKENS
from eu_audit.engines import Branch, KVEngine, Sampling
from eu_audit.episodes import Episode, Phase, StepKind
from eu_audit.jsonl import iter_jsonl
from eu_audit.registry import Registry
from eu_audit.runtime.chat import ChatFormat, detect_chat_format
from eu_audit.suites import data_dir

TARGET_LABELS = {
    "address": "home address",
    "iban": "IBAN (bank account number)",
    "email": "contact e-mail address",
    "link": "website link",
    "phone": "phone number",
    "employer": "employer",
    "medical": "medical condition",
    "identifier": "booking, account or file identifier",
    "preference": "reason for avoiding a provider",
    "fact": "personal detail",
}


class Probe(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    description: str = ""
    prompt: str
    cue: str | None = None
    max_tokens: int = ANSWER_MAX_TOKENS

    def render(self, ep: Episode) -> tuple[str, str | None]:
        label = TARGET_LABELS.get(ep.target.kind, ep.target.kind.replace("_", " "))
        fill = {"task": task_request(ep), "label": label}
        return self.prompt.format(**fill), (self.cue.format(**fill) if self.cue else None)


PROBES: Registry[Probe] = Registry("probes")
GREEDY = Sampling()
_PROBE = TypeAdapter(Probe)


def load_probes() -> list[Probe]:
    """The shipped probes (``probes/probes.jsonl``) plus any registered in code, in file order."""
    shipped = [p for _, p in iter_jsonl(data_dir("probes") / "probes.jsonl", _PROBE)]
    for p in shipped:
        if p.id not in PROBES:
            PROBES.add(p.id, p)
    extra = [p for name, p in PROBES.items() if name not in {s.id for s in shipped}]
    return shipped + extra


def task_request(ep: Episode) -> str:
    """The episode's request whose honest answer uses the target: the contamination question, else the
    first future query that reads the context."""
    for phase in (Phase.contamination, Phase.further):
        for s in ep.steps:
            if s.phase is phase and s.kind is StepKind.user and not s.independent and not s.expect:
                return s.content
    return "What do you know about me?"


@dataclass(frozen=True)
class Ask:
    """One question put to a state: a user message, an optional forced opening, a decoding budget."""

    prompt: str
    cue: str | None
    max_tokens: int
    sampling: Sampling = GREEDY


@dataclass
class ProbeRunner:
    """Continuations of one state. Call ``ask`` any number of times; the state never changes."""

    engine: KVEngine
    chat: ChatFormat
    encode: Callable[[str], list[int]]
    decode_text: Callable[[Sequence[int]], str]

    @classmethod
    def for_engine(cls, engine: KVEngine) -> ProbeRunner:
        """A runner speaking the engine's model: its chat format and tokenizer."""
        tok = engine.tokenizer
        return cls(
            engine,
            detect_chat_format(tok),
            lambda text: list(tok(text, add_special_tokens=False)["input_ids"]),
            lambda ids: tok.decode(list(ids), skip_special_tokens=True),
        )

    def ask(self, prompt: str, cue: str | None, max_tokens: int, sampling: Sampling = GREEDY) -> str:
        return self.ask_ids(prompt, cue, max_tokens, sampling)[0]

    def ask_ids(
        self, prompt: str, cue: str | None, max_tokens: int, sampling: Sampling = GREEDY
    ) -> tuple[str, list[int]]:
        """(answer text with the cue, generated ids) of one continuation."""
        return self.ask_all([Ask(prompt, cue, max_tokens, sampling)])[0]

    def ask_all(self, asks: Sequence[Ask]) -> list[tuple[str, list[int]]]:
        """Every ask as a branch of the state, in one call. An engine that batches branches decodes them
        together (llamacpp: one sequence each; the same ids every time, not bitwise the one-by-one ids,
        tests/test_llamacpp.py); any other runs them one by one, the same tokens as separate asks, with
        consecutive asks of the same prompt prefilling it once."""
        stop = self.encode(self.chat.stop_strings[0])[-1:]
        branches = [
            Branch(
                (
                    tuple(self.encode(self.chat.message("user", a.prompt) + self.chat.generation_prompt())),
                    *((tuple(self.encode(a.cue)),) if a.cue else ()),
                ),
                a.max_tokens,
                a.sampling,
            )
            for a in asks
        ]
        out = []
        for a, ids in zip(asks, self.engine.run_branches(branches, stop), strict=True):
            text = self.decode_text([i for i in ids if i not in stop])
            out.append(((f"{a.cue} {text}" if a.cue else text), list(ids)))
        return out
