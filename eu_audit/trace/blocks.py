"""RuntimeBlock: every artifact of a session, with the provenance tuple of the paper."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class BlockType(StrEnum):
    system = "system"
    memory = "memory"
    user = "user"
    tool_call = "tool_call"
    tool_result = "tool_result"
    assistant = "assistant"
    summary = "summary"
    plan = "plan"
    probe = "probe"


#: Block types produced by the model (derived artifacts); the rest are observations or scaffold.
MODEL_DERIVED = frozenset({BlockType.assistant, BlockType.summary, BlockType.plan, BlockType.tool_call})


class RuntimeBlock(BaseModel):
    """(id, type, parents, source_ids, token_span, turn, committed) plus what replay needs.

    ``token_span`` is the half-open range the block occupies in the KV timeline it was materialised
    in (``None`` for artifacts that live outside the cache: a memory write-back, a tool call record).
    ``token_ids`` are the exact ids prefilled for it, so the cache can be rebuilt bit for bit.
    """

    model_config = ConfigDict(extra="forbid")

    id: str
    type: BlockType
    parents: list[str] = Field(default_factory=list)
    source_ids: list[str] = Field(default_factory=list)
    token_span: tuple[int, int] | None = None
    turn: int
    committed: bool = False
    derived: bool = False
    independent: bool = False
    text: str = ""
    token_ids: list[int] = Field(default_factory=list)
