"""Trace bundle v2 (``eu-audit/trace@2``; v1 still reads), the file format: one record per JSONL line,
tagged by ``type``.

A bundle is a ``header`` line (schema version first), then per session a ``session`` record followed by
its observations, blocks, tool calls, checkpoints, forget requests, ledgers and receipts, and a final
``end`` record that counts the lines before it (so a truncated file is caught, not half-read). The
records themselves are the domain's (``eu_audit.trace.records``); this module adds the end record and
the union a line is validated against.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from eu_audit.trace.records import (
    READS,
    SCHEMA_VERSION,
    AgentForgetRecord,
    BlockRecord,
    CheckpointRecord,
    Decoding,
    ElicitationRecord,
    ForgetRequestRecord,
    Header,
    LedgerRecord,
    MemoryEntry,
    ModelInfo,
    ObservationRecord,
    Occurrence,
    ReceiptRecord,
    ResidueRecord,
    SessionRecord,
    SinkPolicy,
    ToolCallRecord,
    _Record,
)


class EndRecord(_Record):
    type: Literal["end"] = "end"
    records: int  # lines before this one, header included
    sessions: int | None = None  # session records among them (None: written before the count existed)


Record = Annotated[
    Header
    | SessionRecord
    | ObservationRecord
    | BlockRecord
    | ToolCallRecord
    | CheckpointRecord
    | ForgetRequestRecord
    | LedgerRecord
    | ReceiptRecord
    | ElicitationRecord
    | ResidueRecord
    | AgentForgetRecord
    | EndRecord,
    Field(discriminator="type"),
]
RECORD_ADAPTER: TypeAdapter[Any] = TypeAdapter(Record)

SESSION_SCOPED = (
    ObservationRecord,
    BlockRecord,
    ToolCallRecord,
    CheckpointRecord,
    ForgetRequestRecord,
    LedgerRecord,
    ReceiptRecord,
    ElicitationRecord,
    ResidueRecord,
    AgentForgetRecord,
)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of one bundle line (a discriminated union on ``type``)."""
    schema = RECORD_ADAPTER.json_schema()
    schema["$id"] = SCHEMA_VERSION
    schema["title"] = "eu-audit trace bundle record"
    return schema


__all__ = [
    "READS",
    "RECORD_ADAPTER",
    "SCHEMA_VERSION",
    "SESSION_SCOPED",
    "BlockRecord",
    "CheckpointRecord",
    "Decoding",
    "EndRecord",
    "ForgetRequestRecord",
    "Header",
    "LedgerRecord",
    "MemoryEntry",
    "ModelInfo",
    "ObservationRecord",
    "Occurrence",
    "ReceiptRecord",
    "Record",
    "SessionRecord",
    "SinkPolicy",
    "ToolCallRecord",
    "json_schema",
]
