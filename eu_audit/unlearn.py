"""``unlearn``: apply forget methods to every session of a bundle; write post-forget states, ledgers
and forget receipts to a new bundle that links to the input's digest. The input is never modified."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eu_audit.bundle.io import Bundle, SessionTrace, read_bundle, write_bundle
from eu_audit.bundle.records import ForgetRequest, LedgerRecord, Occurrence, ReceiptRecord
from eu_audit.checkpoints import CheckpointPolicy
from eu_audit.errors import BadInput
from eu_audit.methods import METHODS, ORDER, ForgetContext
from eu_audit.methods.base import target_pattern
from eu_audit.runtime.agent import AgentSettings
from eu_audit.runtime.chat import detect_chat_format
from eu_audit.runtime.engine import HFEngine
from eu_audit.runtime.memory import Outbox
from eu_audit.runtime.models import LoadedModel, load_model

Progress = Callable[[str, int, int], None]


def parse_methods(spec: Sequence[str]) -> list[str]:
    """``["b7"]``, ``["b0,b5,b7"]`` or ``["all"]`` -> method names, validated against the registry."""
    names: list[str] = []
    for item in spec:
        for name in (p.strip().lower() for p in item.split(",")):
            if not name:
                continue
            if name == "all":
                names += [m for m in ORDER if m not in names]
                continue
            METHODS.get(name)  # BadInput naming the known methods
            if name not in names:
                names.append(name)
    if not names:
        raise BadInput("no method given (e.g. --method b7, --method b0,b5,b7 or --method all)")
    return names


def receipt(trace: SessionTrace, method: str, request: ForgetRequest) -> ReceiptRecord:
    """Where the target's variants are left: context blocks, memory, tool calls."""
    pat = target_pattern([request.target, *request.variants])
    occ: list[Occurrence] = []
    resident = set(trace.session.final_manifest)
    for b in trace.blocks:
        if b.id in resident and pat.search(b.text):
            occ.append(Occurrence(where="context", id=b.id, kind=b.type.value, turn=b.turn))
    for m in trace.session.memory_final:
        if pat.search(m.text):
            occ.append(Occurrence(where="memory", id=m.id, kind="memory"))
    blocked = 0
    policy = trace.session.sink_policy
    for c in trace.tool_calls:
        text = c.raw + " " + str(c.arguments or "")
        if not pat.search(text):
            continue
        if c.committed:
            occ.append(Occurrence(where="committed_tool_call", id=c.call_id, kind=c.name, turn=c.turn))
        elif c.status in ("pending", "shadowed"):
            occ.append(Occurrence(where="pending_tool_call", id=c.call_id, kind=c.name, turn=c.turn))
        if (
            policy
            and c.status == "pending"
            and c.arguments is not None
            and policy.blocks(c.name, c.arguments)
        ):
            blocked += 1
    clean = not any(o.where != "committed_tool_call" for o in occ)
    shadowed = sum(c.status == "shadowed" for c in trace.tool_calls)
    return ReceiptRecord(
        session_id=trace.session_id,
        method=method,
        target=request.target,
        clean=clean,
        occurrences=occ,
        blocked_sinks=blocked,
        shadowed_calls=shadowed,
    )


@dataclass
class UnlearnResult:
    bundle: Bundle
    path: Path
    rows: list[tuple[str, str, LedgerRecord, ReceiptRecord]] = field(
        default_factory=list
    )  # sid, method, ledger, receipt


def default_output(path: Path, methods: list[str]) -> Path:
    tag = methods[0] if len(methods) == 1 else "unlearned"
    return path.with_name(f"{path.stem}.{tag}{path.suffix or '.jsonl'}")


def unlearn(
    bundle_path: str | Path,
    methods: Sequence[str],
    out: str | Path | None = None,
    *,
    target: str | None = None,
    source: str | None = None,
    model: str | None = None,
    outbox: str | Path | None = None,
    force: bool = False,
    progress: Progress | None = None,
    loaded: LoadedModel | None = None,
) -> UnlearnResult:
    bundle_path = Path(bundle_path)
    names = parse_methods(methods)
    bundle = read_bundle(bundle_path)
    if any(s.session.method for s in bundle.sessions):
        raise BadInput(
            "this bundle already holds post-forget states; unlearn reads recorded sessions",
            path=str(bundle_path),
        )
    out_path = Path(out) if out else default_output(bundle_path, names)
    if out_path.resolve() == bundle_path.resolve():
        raise BadInput("the output would overwrite the input bundle; choose another -o", path=str(out_path))
    if out_path.exists() and not force:
        raise BadInput(f"{out_path} exists; pass --force to replace it")
    h = bundle.header
    loaded = loaded or load_model(model or h.model.name, dtype=h.model.dtype)
    if loaded.weight_digest != h.model.weight_digest:
        raise BadInput(
            f"the bundle was recorded with weights {h.model.weight_digest[:12]}… but model "
            f"'{loaded.name}' has {loaded.weight_digest[:12]}…; replay needs the same weights",
            path=str(bundle_path),
            line=1,
            field="model.weight_digest",
        )
    engine = HFEngine(loaded)  # refuses models whose cache cannot be cropped exactly
    chat = detect_chat_format(loaded.tokenizer)
    default_outbox = bundle_path.with_name(bundle_path.name + ".state") / "outbox.sqlite"
    box = Outbox(Path(outbox) if outbox else default_outbox if default_outbox.exists() else Path(":memory:"))
    settings = AgentSettings(
        max_tokens=h.decoding.max_tokens,
        temperature=h.decoding.temperature,
        checkpoint_policy=CheckpointPolicy(h.checkpoint_policy),
    )
    sessions: list[SessionTrace] = []
    rows: list[tuple[str, str, LedgerRecord, ReceiptRecord]] = []
    total, done = len(bundle.sessions) * len(names), 0
    try:
        for trace in bundle.sessions:
            request = _request(trace, target, source)
            policy = trace.session.episode.checkpoint_policy or h.checkpoint_policy
            session_settings = dataclasses.replace(settings, checkpoint_policy=CheckpointPolicy(policy))
            ctx = ForgetContext(loaded, chat, engine, trace, request, session_settings, box)
            for name in names:
                if progress:
                    progress(f"{trace.session_id} {name}", done, total)
                # Every method branches from the same contaminated state; base_state builds it from the
                # recorded ids (keeping any prefix the engine already holds, e.g. the system prompt).
                ctx.base_state()
                result = METHODS.get(name)(ctx)
                rec = receipt(result.trace, name, request)
                result.trace.ledgers.append(
                    result.ledger.model_copy(update={"session_id": result.trace.session_id})
                )
                result.trace.receipts.append(rec)
                sessions.append(result.trace)
                rows.append((trace.session_id, name, result.ledger, rec))
                done += 1
                if progress:
                    progress(f"{trace.session_id} {name}", done, total)
    finally:
        box.close()
    header = h.model_copy(update={"parent_digest": bundle.digest, "kv_sidecar": None})
    out_bundle = Bundle(header=header, sessions=sessions, path=out_path)
    write_bundle(out_path, out_bundle.records())
    return UnlearnResult(bundle=out_bundle, path=out_path, rows=rows)


def _request(trace: SessionTrace, target: str | None, source: str | None) -> ForgetRequest:
    if target is None:
        if not trace.forget_requests:
            raise BadInput(f"session {trace.session_id} has no forget request; pass --target (and --source)")
        req = trace.forget_requests[0]
        return req.model_copy(update={"source": source or req.source})
    variants = trace.session.target.variants if target == trace.session.target.value else []
    return ForgetRequest(
        session_id=trace.session_id, target=target, source=source, variants=variants, reason="command line"
    )
