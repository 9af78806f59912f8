"""Chat formats: how one message becomes one segment of text.

The canonical schedule tokenizes each segment on its own, so a segment must begin at a special-token
boundary. We render messages ourselves from the family's markers (after recognising the model's chat
template) instead of re-rendering the whole conversation, which some templates rewrite (e.g. they
inject a default system prompt or strip whitespace from earlier turns).
"""

from __future__ import annotations

from dataclasses import dataclass

from eu_audit.errors import BadInput


@dataclass(frozen=True)
class ChatFormat:
    name: str
    start: str  # "{role}" is replaced
    end: str  # closes a message; the model emits it (or its stop token) to end a turn
    stop_strings: tuple[str, ...]
    bos: str = ""  # text that opens a conversation (Llama-3 needs its begin-of-text token)

    def message(self, role: str, content: str) -> str:
        return self.start.replace("{role}", role) + content + self.end

    def generation_prompt(self) -> str:
        return self.start.replace("{role}", "assistant")


CHATML = ChatFormat("chatml", "<|im_start|>{role}\n", "<|im_end|>\n", ("<|im_end|>",))
LLAMA3 = ChatFormat(
    "llama3",
    "<|start_header_id|>{role}<|end_header_id|>\n\n",
    "<|eot_id|>",
    ("<|eot_id|>",),
    bos="<|begin_of_text|>",
)


def detect_chat_format(tokenizer: object) -> ChatFormat:
    template = getattr(tokenizer, "chat_template", None) or ""
    if "<|im_start|>" in template:
        return CHATML
    if "<|start_header_id|>" in template:
        return LLAMA3
    raise BadInput(
        "unsupported chat template: eu-audit renders ChatML (Qwen, SmolLM2) and Llama-3 "
        "formats; this model's template is neither"
    )
