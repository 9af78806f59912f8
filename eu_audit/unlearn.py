"""``unlearn``: apply forget methods to every session of a bundle; write post-forget states, ledgers
and forget receipts to a new bundle that links to the input's digest. The input is never modified."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

from eu_audit.bundle.io import file_digest, read_bundle, write_bundle
from eu_audit.bundle.validate import check_tokens
from eu_audit.checkpoints import CheckpointPolicy
from eu_audit.engines import ENGINES, KVEngine, abilities_of, open_engine
from eu_audit.engines.base import factory_of
from eu_audit.errors import BadInput
from eu_audit.jsonl import check_output_path
from eu_audit.matching import TargetMatcher
from eu_audit.methods import METHODS, ForgetContext, all_methods, apply_method
from eu_audit.methods.base import locate
from eu_audit.models import LoadedModel
from eu_audit.progress import Progress
from eu_audit.runtime.agent import AgentSettings
from eu_audit.runtime.chat import detect_chat_format
from eu_audit.runtime.memory import Outbox
from eu_audit.trace.records import ForgetRequestRecord, LedgerRecord, Occurrence, ReceiptRecord
from eu_audit.trace.session import Bundle, SessionTrace


def parse_methods(spec: Sequence[str], engine: str | None = None) -> list[str]:
    """``["b7"]``, ``["b0,b5,b7"]`` or ``["all"]`` -> method names, validated against the registry.
    With ``engine``, ``all`` means every method that engine can run (span-only excision needs the
    ``excise`` ability); a method named explicitly is kept, and ``check_engine`` refuses it if it cannot
    run."""
    names: list[str] = []
    for item in spec:
        for name in (p.strip().lower() for p in item.split(",")):
            if not name:
                continue
            if name == "all":
                names += [m for m in all_methods() if m not in names and runs_on(m, engine)]
                continue
            METHODS.get(name)  # BadInput naming the known methods
            if name not in names:
                names.append(name)
    if not names:
        raise BadInput("no method given (e.g. --method b7, --method b0,b5,b7 or --method all)")
    return names


def runs_on(method: str, engine: str | None) -> bool:
    return engine is None or METHODS.get(method).runs_on(abilities_of(engine))


def check_engine(names: Sequence[str], engine: str) -> None:
    """Refuse, before any compute, a method the engine cannot run (excision needs KV tensors)."""
    abilities = abilities_of(engine)
    for name in names:
        spec = METHODS.get(name)
        if not spec.runs_on(abilities):
            able = [e for e, cls in ENGINES.items() if spec.runs_on(cls.abilities)]
            raise BadInput(
                f"method '{name}' needs an engine that can {', '.join(sorted(spec.needs))} (engines: "
                f"{', '.join(able) or 'none'}); this bundle runs on '{engine}'. Record on one of those"
            )


def engine_for(
    bundle: Bundle,
    *,
    model: str | None = None,
    loaded: LoadedModel | None = None,
    server: str | None = None,
) -> KVEngine:
    """The engine a bundle was recorded on, with its model, checked against the bundle (weights, chat
    template, token ids) before it runs anything. A served bundle goes back to its server (``server``
    overrides the URL the header records)."""
    header = bundle.header
    factory = factory_of(header.engine)
    if model and loaded is None:  # refuse a wrong --model before loading it, where the engine can tell
        have = factory.weights_digest_unloaded(model)
        if have is not None:
            _same_model(bundle, model, "weights", "model.weight_digest", header.model.weight_digest, have)
    options = factory.reopen_options(header.engine_facts, server=server)
    engine = open_engine(
        header.engine, model or header.model.name, dtype=header.model.dtype, loaded=loaded, **options
    )
    check_bundle_model(bundle, engine)
    return engine


def check_bundle_model(bundle: Bundle, engine: KVEngine) -> None:
    """The model is the one the bundle was recorded with (weights and chat template), and every block's
    token ids are in its vocabulary and say what the block's text says."""
    header, got = bundle.header, engine.loaded
    _same_model(
        bundle, got.name, "weights", "model.weight_digest", header.model.weight_digest, got.weight_digest
    )
    _same_model(
        bundle,
        got.name,
        "chat template",
        "model.chat_template_digest",
        header.model.chat_template_digest,
        got.chat_template_digest,
    )
    tok = engine.tokenizer
    check_tokens(bundle, tok, engine.vocab_size)


def _same_model(bundle: Bundle, name: str, what: str, fld: str, want: str, have: str) -> None:
    if want != have:
        raise BadInput(
            f"the bundle was recorded with {what} {want[:12]}… but model '{name}' has {have[:12]}…; "
            f"replay needs the same {what}",
            path=str(bundle.path) if bundle.path else None,
            line=1,
            field=fld,
        )


def receipt(trace: SessionTrace, method: str, request: ForgetRequestRecord) -> ReceiptRecord:
    """Where the target's variants are left: context blocks, memory, tool calls (the same matcher the
    audits use, so a receipt never calls clean what an audit counts as a leak)."""
    m = TargetMatcher.of(request.target, request.variants)
    occ: list[Occurrence] = []
    resident = set(trace.session.final_manifest)
    for b in trace.blocks:
        if b.id in resident and m.found_in(b.text):
            occ.append(Occurrence(where="context", id=b.id, kind=b.type.value, turn=b.turn))
    for mem in trace.session.memory_final:
        if m.found_in(mem.text):
            occ.append(Occurrence(where="memory", id=mem.id, kind="memory"))
    blocked = 0
    policy = trace.session.sink_policy
    for c in trace.tool_calls:
        if not m.found_in(c.raw + " " + json.dumps(c.arguments or {})):
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


def outbox_side_effects(box: Outbox, trace: SessionTrace, request: ForgetRequestRecord) -> list[Occurrence]:
    """Calls the real outbox holds for the session that carried the target: side effects that happened
    (A3), whether or not the bundle marks them, listed on every receipt."""
    m = TargetMatcher.of(request.target, request.variants)
    known = {c.call_id for c in trace.tool_calls if c.committed}
    out = []
    for call_id, _sid, tool, arguments in box.rows(trace.session_id):
        if call_id not in known and m.found_in(arguments):
            out.append(Occurrence(where="committed_tool_call", id=call_id, kind=tool))
    return out


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


def default_outbox(bundle_path: Path) -> Path:
    return bundle_path.with_name(bundle_path.name + ".state") / "outbox.sqlite"


def open_outbox(bundle_path: Path, outbox: str | Path | None) -> Outbox:
    """The real outbox replay consults for dedup: the one given (it must exist), else the recording's
    own (``<input>.state/outbox.sqlite``) when present, else an empty one in memory."""
    if outbox is not None:
        path = Path(outbox)
        if not path.is_file():
            raise BadInput("no such outbox (an outbox.sqlite written by eu-audit record)", path=str(path))
        return Outbox(path)
    found = default_outbox(bundle_path)
    return Outbox(found if found.is_file() else Path(":memory:"))


def unlearn(
    bundle_path: str | Path,
    methods: Sequence[str],
    out: str | Path | None = None,
    *,
    target: str | None = None,
    source: str | None = None,
    model: str | None = None,
    outbox: str | Path | None = None,
    server: str | None = None,
    force: bool = False,
    progress: Progress | None = None,
    loaded: LoadedModel | None = None,
    engine: KVEngine | None = None,
) -> UnlearnResult:
    bundle_path = Path(bundle_path)
    bundle = read_bundle(bundle_path)
    names = parse_methods(methods, engine.name if engine is not None else bundle.header.engine)
    if any(s.session.method for s in bundle.sessions):
        raise BadInput(
            "this bundle already holds post-forget states; unlearn reads recorded sessions",
            path=str(bundle_path),
        )
    out_path = Path(out) if out else default_output(bundle_path, names)
    if out_path.resolve() == bundle_path.resolve():
        raise BadInput("the output would overwrite the input bundle; choose another -o", path=str(out_path))
    check_output_path(out_path)
    if out_path.exists() and not force:
        raise BadInput(f"{out_path} exists; pass --force to replace it")
    h = bundle.header
    check_engine(names, engine.name if engine is not None else h.engine)
    requests = [
        _located(bundle, trace, partial(_request, trace, target, source)) for trace in bundle.sessions
    ]
    if target is not None or source is not None:
        # a --target or --source from the command line resolves before a model loads; a bundle's own
        # requests are checked with its token ids first (check_bundle_model names an edited block)
        for trace, request in zip(bundle.sessions, requests, strict=True):
            _located(bundle, trace, partial(locate, trace, request))
    box = open_outbox(bundle_path, outbox)
    if engine is None:
        engine = engine_for(bundle, model=model, loaded=loaded, server=server)
    else:
        check_bundle_model(bundle, engine)
    chat = detect_chat_format(engine.tokenizer)
    settings = AgentSettings(
        max_tokens=h.decoding.max_tokens,
        temperature=h.decoding.temperature,
        checkpoint_policy=CheckpointPolicy(h.checkpoint_policy),
    )
    sessions: list[SessionTrace] = []
    rows: list[tuple[str, str, LedgerRecord, ReceiptRecord]] = []
    total, done = len(bundle.sessions) * len(names), 0
    try:
        for trace, request in zip(bundle.sessions, requests, strict=True):
            policy = trace.session.episode.checkpoint_policy or h.checkpoint_policy
            session_settings = dataclasses.replace(settings, checkpoint_policy=CheckpointPolicy(policy))
            ctx = ForgetContext(chat, engine, trace, request, session_settings, box)
            side_effects = outbox_side_effects(box, trace, request)
            for name in names:
                if progress:
                    progress(f"{trace.session_id} {name}", done, total)
                # Every method branches from the same contaminated state; base_state builds it from the
                # recorded ids (keeping any prefix the engine already holds, e.g. the system prompt).
                ctx.base_state()
                result, ledger = _located(bundle, trace, partial(apply_method, ctx, name))
                rec = receipt(result.trace, name, request)
                rec.occurrences += side_effects
                result.trace.ledgers.append(ledger)
                result.trace.receipts.append(rec)
                sessions.append(result.trace)
                rows.append((trace.session_id, name, ledger, rec))
                done += 1
                if progress:
                    progress(f"{trace.session_id} {name}", done, total)
    finally:
        box.close()
    header = h.model_copy(update={"parent_digest": bundle.digest, "kv_sidecar": None})
    out_bundle = Bundle(header=header, sessions=sessions, path=out_path)
    write_bundle(out_path, out_bundle.records())
    # the digest of the file as written, as if it had been read: an audit's resume file names it
    out_bundle.digest = file_digest(out_path)
    return UnlearnResult(bundle=out_bundle, path=out_path, rows=rows)


T = TypeVar("T")


def _located(bundle: Bundle, trace: SessionTrace, run: Callable[[], T]) -> T:
    """Run one session's step; a refusal that does not say where is placed at the session's line."""
    try:
        return run()
    except BadInput as exc:
        line = bundle.lines.get((trace.session_id, "session", ""))
        raise exc.located(
            str(bundle.path) if bundle.path else None, line, f"session {trace.session_id}: "
        ) from None


def _request(trace: SessionTrace, target: str | None, source: str | None) -> ForgetRequestRecord:
    if target is None:
        if not trace.forget_requests:
            raise BadInput(f"session {trace.session_id} has no forget request; pass --target (and --source)")
        req = trace.forget_requests[0]
        return req.model_copy(update={"source": source or req.source})
    variants = trace.session.target.variants if target == trace.session.target.value else []
    return ForgetRequestRecord(
        session_id=trace.session_id, target=target, source=source, variants=variants, reason="command line"
    )
