"""Structured output: a reply held to a JSON schema token by token, the way llama.cpp's server and vLLM
honour OpenAI's ``response_format``.

Memory libraries ask their model for JSON that matches a schema (Graphiti's entity and edge extraction,
mem0's fact extraction, Letta's and LangMem's tool arguments) and stop when it does not parse. Servers
that do constrained decoding never give them prose, so a small local model behind ``eu-audit serve``
must not either, or a stack is "not measurable" for a reason no deployment has. Before each token the
ids that cannot continue a JSON text matching the schema are masked out (llguidance, over the model's
own tokenizer); once the text is complete only the chat format's stop id remains. At temperature 0 the
reply is the argmax among the allowed ids: a function of the prompt, the schema and the weights alone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from eu_audit.errors import BadInput

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

#: the model's own layout (newlines, indentation), each gap capped as llama.cpp's JSON grammar caps it, so
#: a model cannot loop on whitespace. Compact JSON is not neutral: held to it, Qwen2.5-Coder-0.5B closed
#: mem0's fact list at once in 19 of 19 extraction calls (`{"memory": []}`); it writes that JSON indented.
JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": True,
    "whitespace_pattern": "[\\x20\\x0A\\x0D\\x09]{1,24}",
}


class Constraint(Protocol):
    """What decoding asks before and after each token (``LocalEngine.decode``)."""

    def restrict(self, logits: Any) -> np.ndarray:
        """The logits with every id the constraint forbids set to -inf (a new array)."""
        ...

    def accept(self, token: int) -> None:
        """The id decoding picked, so the next mask follows it."""
        ...


@dataclass(frozen=True)
class JsonShape:
    """What a reply is held to: JSON matching ``schema``, then the text ``after`` (a forced call's closing
    brace). ``name`` is what the log calls it; ``field`` the request field a bad schema came from;
    ``lenient`` (a tool's parameters, which the client never asked serve to enforce): keywords the
    compiler does not implement are ignored, and a schema it cannot take leaves the reply free."""

    schema: dict[str, Any]
    name: str
    after: str = ""
    field: str = "response_format"
    lenient: bool = False


class JsonConstraint:
    """One reply's matcher: the grammar's state after the ids decoded so far."""

    def __init__(self, matcher: Any, vocab: int) -> None:
        self.matcher, self.vocab = matcher, vocab
        self._bits = np.zeros(((vocab + 31) // 32,), dtype=np.int32)

    def allowed(self) -> np.ndarray:
        self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        return np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self.vocab].astype(bool)

    def restrict(self, logits: Any) -> np.ndarray:
        scores = np.array(logits, dtype=np.float32, copy=True).reshape(-1)
        allowed = self.allowed()
        n = min(len(scores), len(allowed))
        scores[:n][~allowed[:n]] = -np.inf
        scores[n:] = -np.inf  # ids past the tokenizer's (padding rows of the embedding) are never text
        return scores

    def accept(self, token: int) -> None:
        self.matcher.consume_token(int(token))


class StructuredOutput:
    """A model's tokenizer as llguidance reads it (built once, ~1 s for a 150k vocabulary), and the
    constraint for each request that asks for JSON."""

    def __init__(self, tokenizer: Any, vocab: int, stop_ids: Sequence[int]) -> None:
        try:
            import llguidance.hf
        except ImportError as exc:  # a core dependency; only a broken install lacks it
            raise BadInput(f"structured output needs the 'llguidance' package ({exc})") from None
        self.vocab = vocab
        self._llg = llguidance
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=list(stop_ids))

    def constraint(self, shape: JsonShape) -> JsonConstraint:
        """A fresh matcher for one reply: JSON matching the shape's schema, then its ``after`` text, then
        the stop id. A schema the compiler cannot take is refused, naming the request field and why."""
        options = {**JSON_OPTIONS, **({"lenient": True} if shape.lenient else {})}
        try:
            spec = json.dumps({**shape.schema, "x-guidance": options})
        except (TypeError, ValueError) as exc:
            raise BadInput(f"field '{shape.field}': not a JSON schema ({exc})") from None
        grammar = self._llg.LLMatcher.grammar_from_lark(f"start: %json {spec} {json.dumps(shape.after)}")
        matcher = self._llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            reason = matcher.get_error().splitlines()[0].split("failed to compile JSON schema: ")[-1]
            raise BadInput(f"field '{shape.field}': the schema cannot be enforced: {reason}")
        return JsonConstraint(matcher, self.vocab)
