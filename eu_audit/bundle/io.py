"""Read and write trace bundles. Reads validate every line; writes are atomic and private (0600).

This module is the file format's boundary: it turns lines into the domain objects of
``eu_audit.trace`` and back, and nothing else.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from eu_audit.bundle.records import (
    READS,
    RECORD_ADAPTER,
    SESSION_SCOPED,
    AgentForgetRecord,
    BlockRecord,
    CheckpointRecord,
    ElicitationRecord,
    EndRecord,
    ForgetRequestRecord,
    Header,
    LedgerRecord,
    ObservationRecord,
    ReceiptRecord,
    ResidueRecord,
    SessionRecord,
    ToolCallRecord,
)
from eu_audit.bundle.validate import check_structure
from eu_audit.errors import BadInput
from eu_audit.jsonl import (
    check_input_file,
    describe_validation_error,
    iter_jsonl,
    max_input_bytes,
    parse_line,
    write_jsonl,
)
from eu_audit.trace.session import Bundle, SessionTrace

__all__ = ["Bundle", "SessionTrace", "file_digest", "read_bundle", "write_bundle"]


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _check_header_line(path: Path) -> None:
    """Give wrong-version and not-a-bundle files their own clear message before full validation."""
    check_input_file(path)  # before opening: a FIFO would block the read
    try:
        with open(path, "rb") as f:
            first = f.readline(max_input_bytes())
        obj = parse_line(first)
    except (OSError, ValueError):
        return  # iter_jsonl reports it with the line number
    if not isinstance(obj, dict) or obj.get("type") != "header":
        raise BadInput(
            "the first line must be the bundle header (type 'header'); is this a trace bundle?",
            path=str(path),
            line=1,
            field="type",
        )
    version = obj.get("schema_version")
    if version not in READS:
        raise BadInput(
            f"unsupported schema version {version!r}; this eu-audit reads {', '.join(READS)}",
            path=str(path),
            line=1,
            field="schema_version",
        )


def read_bundle(path: str | Path) -> Bundle:
    """Validate and load a bundle. Never modifies the file."""
    path = Path(path)
    _check_header_line(path)
    header: Header | None = None
    sessions: dict[str, SessionTrace] = {}
    lines: dict[tuple[str, str, str], int] = {}
    count = 0
    ended = False
    for lineno, rec in iter_jsonl(path, RECORD_ADAPTER):
        if ended:
            raise BadInput("records after the end record", path=str(path), line=lineno)
        if lineno == 1:
            assert isinstance(rec, Header)
            header = rec
        elif isinstance(rec, Header):
            raise BadInput("a second header", path=str(path), line=lineno, field="type")
        elif isinstance(rec, EndRecord):
            if rec.records != count:
                raise BadInput(
                    f"end record counts {rec.records} records but {count} precede it "
                    "(lines were lost or added)",
                    path=str(path),
                    line=lineno,
                    field="records",
                )
            if rec.sessions is not None and rec.sessions != len(sessions):
                raise BadInput(
                    f"end record counts {rec.sessions} sessions but {len(sessions)} precede it "
                    "(a session was removed or added)",
                    path=str(path),
                    line=lineno,
                    field="sessions",
                )
            ended = True
        elif isinstance(rec, SessionRecord):
            if rec.session_id in sessions:
                raise BadInput(
                    f"session '{rec.session_id}' appears twice",
                    path=str(path),
                    line=lineno,
                    field="session_id",
                )
            sessions[rec.session_id] = SessionTrace(session=rec)
            lines[(rec.session_id, "session", "")] = lineno
        elif isinstance(rec, SESSION_SCOPED):
            trace = sessions.get(rec.session_id)
            if trace is None:
                raise BadInput(
                    f"refers to session '{rec.session_id}' before (or without) its session record",
                    path=str(path),
                    line=lineno,
                    field="session_id",
                )
            lines[_line_key(trace, rec)] = lineno
            _attach(trace, rec, path, lineno)
        count += 1
    if header is None:
        raise BadInput("empty file, expected a trace bundle", path=str(path))
    if not ended:
        raise BadInput(f"truncated: no end record after line {count}", path=str(path), line=count)
    bundle = Bundle(
        header=header, sessions=list(sessions.values()), path=path, digest=file_digest(path), lines=lines
    )
    check_structure(bundle)
    return bundle


def _line_key(trace: SessionTrace, rec: Any) -> tuple[str, str, str]:
    """The key a check uses to name this record's line (read before the record is attached)."""
    sid = trace.session_id
    if isinstance(rec, BlockRecord):
        return (sid, "block", rec.block.id)
    if isinstance(rec, CheckpointRecord):
        return (sid, "checkpoint", rec.checkpoint.id)
    counts: dict[type, tuple[str, list[Any]]] = {
        ObservationRecord: ("observation", trace.observations),
        ToolCallRecord: ("tool_call", trace.tool_calls),
        LedgerRecord: ("ledger", trace.ledgers),
        ForgetRequestRecord: ("forget_request", trace.forget_requests),
    }
    kind, held = counts.get(type(rec), (str(rec.type), []))
    return (sid, kind, str(len(held)))


def _attach(trace: SessionTrace, rec: Any, path: Path, lineno: int) -> None:
    if isinstance(rec, ObservationRecord):
        trace.observations.append(rec)
    elif isinstance(rec, BlockRecord):
        known = {b.id for b in trace.blocks}
        if rec.block.id in known:
            raise BadInput(
                f"block '{rec.block.id}' appears twice", path=str(path), line=lineno, field="block.id"
            )
        missing = [p for p in rec.block.parents if p not in known]
        if missing:
            raise BadInput(
                f"parent {missing[0]!r} is not an earlier block of the session",
                path=str(path),
                line=lineno,
                field="block.parents",
            )
        trace.blocks.append(rec.block)
    elif isinstance(rec, ToolCallRecord):
        trace.tool_calls.append(rec)
    elif isinstance(rec, CheckpointRecord):
        trace.checkpoints.append(rec.checkpoint)
    elif isinstance(rec, ForgetRequestRecord):
        trace.forget_requests.append(rec)
    elif isinstance(rec, LedgerRecord):
        trace.ledgers.append(rec)
    elif isinstance(rec, ReceiptRecord):
        trace.receipts.append(rec)
    elif isinstance(rec, ElicitationRecord):
        trace.elicitations.append(rec)
    elif isinstance(rec, ResidueRecord):
        trace.residues.append(rec)
    elif isinstance(rec, AgentForgetRecord):
        trace.agent_forgets.append(rec)


def write_bundle(path: str | Path, records: Iterable[BaseModel]) -> Path:
    """Write ``records`` (header first) plus the end record, atomically, mode 0600."""
    path = Path(path)
    recs = list(records)
    if not recs or not isinstance(recs[0], Header):
        raise ValueError("a bundle starts with its header")
    try:
        for r in recs:  # validate before anything touches the disk
            RECORD_ADAPTER.validate_python(r.model_dump())
    except ValidationError as exc:
        fld, msg = describe_validation_error(exc)
        raise ValueError(f"refusing to write an invalid record ({fld}: {msg})") from exc
    sessions = sum(isinstance(r, SessionRecord) for r in recs)
    write_jsonl(path, [*recs, EndRecord(records=len(recs), sessions=sessions)])
    return path
