"""A bundle as a whole: the invariants that tie its records together, checked before anything runs on it.

A forget receipt is evidence, so a bundle whose lines each look right but contradict each other (a
manifest naming a block that does not exist, token ids that disagree with their text, a checkpoint
offset that is not its manifest's length) must be refused, never replayed into a clean receipt. Two
stages:

- ``check_structure`` needs nothing but the records (the reader runs it on every bundle it returns);
- ``check_tokens`` needs the model's tokenizer (token ids inside the vocabulary, each block's text what
  its ids decode to) and runs once the model is known, still before any forward pass.

Each refusal names the file, the line of the offending record and its field (exit 2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from eu_audit.episodes import StepKind
from eu_audit.errors import BadInput
from eu_audit.runtime.chat import ChatFormat, detect_chat_format
from eu_audit.runtime.world import WorldView, memory_shown
from eu_audit.trace.session import Bundle, SessionTrace

#: where each record came from: (session id, record kind, key) -> line number
LineKey = tuple[str, str, str]


def _refuse(bundle: Bundle, key: LineKey | None, field: str, message: str) -> BadInput:
    line = bundle.lines.get(key) if key is not None else None
    return BadInput(message, path=str(bundle.path) if bundle.path else None, line=line, field=field)


def check_structure(bundle: Bundle) -> None:
    """Every cross-record invariant the format implies, per session."""
    in_cache = bundle.header.side == "white"  # a black-box run holds no cache, so no token spans
    for trace in bundle.sessions:
        _check_session(bundle, trace, in_cache)


def _check_session(bundle: Bundle, trace: SessionTrace, in_cache: bool) -> None:
    check = _SessionCheck(bundle, trace, in_cache)
    check.episode()
    check.blocks()
    final_tokens = check.manifests()
    check.checkpoints()
    check.records(final_tokens)
    if in_cache and trace.session.method is None:
        check.observations()
        check.target_occurs()
        check.forget_requests_name_what_was_seen()


class _SessionCheck:
    """One session's invariants, a group per method; each refusal names the record's line."""

    def __init__(self, bundle: Bundle, trace: SessionTrace, in_cache: bool) -> None:
        self.bundle, self.trace, self.in_cache = bundle, trace, in_cache
        self.sid = trace.session_id
        self.s = trace.session
        self.here: LineKey = (self.sid, "session", "")
        self.by_id = {b.id: b for b in trace.blocks}
        self.T = self.s.transitions
        if self.T < 0:
            raise self.fail(self.here, "transitions", f"{self.T} transitions")

    def fail(self, key: LineKey | None, field: str, message: str) -> BadInput:
        return _refuse(self.bundle, key, field, f"session '{self.sid}': {message}")

    def episode(self) -> None:
        """The session is its episode's: the same id, suite, target, source and length. (A session whose
        target differs from the script it replays would get a receipt for a target it never held.)"""
        s, ep = self.s, self.s.episode
        agree: list[tuple[str, object, object]] = [
            ("episode_id", s.episode_id, ep.id),
            ("target.value", s.target.value, ep.target.value),
            ("target.variants", s.target.variants, ep.target.variants),
            ("source_id", s.source_id, ep.source_id),
        ]
        if s.method is None:  # a method may add transitions (B2's forget instruction)
            agree.append(("transitions", s.transitions, len(ep.steps)))
        for field, have, want in agree:
            if have != want:
                raise self.fail(
                    self.here, field, f"{field} is {have!r} but its episode's is {want!r} (edited?)"
                )

    def observations(self) -> None:
        """A recorded observation is what its episode step shows in the recorded world: its kind and
        phase always; its text for user and memory steps (tool results come from the environment)."""
        ep, view = self.s.episode, WorldView(self.s.episode, "factual")
        for i, o in enumerate(self.trace.observations):
            key: LineKey = (self.sid, "observation", str(i))
            step = ep.steps[o.t - 1] if 1 <= o.t <= len(ep.steps) else None
            if step is None or (o.kind, o.phase) != (step.kind, step.phase):
                raise self.fail(
                    key, "kind", f"observation at t={o.t} is not its episode step's kind or phase"
                )
            want = None
            if step.kind is StepKind.user:
                want = view.text(step)
            elif step.kind is StepKind.memory:
                rid, text, _ = view.memory_record(step, o.t)
                want = memory_shown(rid, text)
            if want is not None and o.content != want:
                raise self.fail(
                    key, "content", f"observation at t={o.t} differs from its episode step's text (edited?)"
                )

    def target_occurs(self) -> None:
        """A recorded session holds its target somewhere (an observation, a block, memory, a call):
        otherwise a forget has nothing to remove, and a clean receipt would prove nothing."""
        m = self.trace.matcher()
        texts = [
            *(o.content for o in self.trace.observations),
            *(b.text for b in self.trace.blocks),
            *(mem.text for mem in self.s.memory_final),
            *(c.raw for c in self.trace.tool_calls),
        ]
        if not any(m.found_in(t) for t in texts):
            raise self.fail(
                self.here,
                "target.value",
                "the target never occurs in the recorded session; there is nothing to forget, and a clean "
                "receipt would prove nothing",
            )

    def forget_requests_name_what_was_seen(self) -> None:
        """A forget request asks to remove something the session observed: its target (or a variant) occurs
        in an observation, and a source it names is an observation's source. A request for what never was
        ("Nowhere Lane 77") would otherwise get a clean receipt: nothing to remove, so nothing left."""
        from eu_audit.matching import TargetMatcher

        seen = [o.content for o in self.trace.observations]
        sources = {sid for o in self.trace.observations for sid in o.source_ids}
        for i, fr in enumerate(self.trace.forget_requests):
            key: LineKey = (self.sid, "forget_request", str(i))
            if not fr.target.strip():
                continue  # refused as empty by records()
            m = TargetMatcher.of(fr.target, fr.variants)
            if not any(m.found_in(text) for text in seen):
                raise self.fail(
                    key,
                    "target",
                    f"the forget request's target {fr.target!r} occurs in no observation of the session: "
                    "there is nothing to forget, and a clean receipt would prove nothing",
                )
            if fr.source is not None and sources and fr.source not in sources:
                raise self.fail(key, "source", f"names source {fr.source!r}, which no observation came from")

    def blocks(self) -> None:
        """Turns in 0..T and in order; a span as long as the token ids it holds."""
        last_turn = 0
        for b in self.trace.blocks:
            key: LineKey = (self.sid, "block", b.id)
            if not 0 <= b.turn <= self.T:
                raise self.fail(key, "block.turn", f"block '{b.id}' is at turn {b.turn}, outside 0..{self.T}")
            if b.turn < last_turn:  # a session is recorded in order: a block never precedes its parents
                raise self.fail(
                    key,
                    "block.turn",
                    f"block '{b.id}' is at turn {b.turn}, after a block of turn {last_turn}",
                )
            last_turn = b.turn
            if b.token_span is None:  # outside the cache (a post-forget state may keep a dropped block's ids)
                continue
            start, end = b.token_span
            if not 0 <= start <= end:
                raise self.fail(key, "block.token_span", f"block '{b.id}' has span {b.token_span}")
            if end - start != len(b.token_ids):
                raise self.fail(
                    key,
                    "block.token_span",
                    f"block '{b.id}' spans {end - start} positions but holds {len(b.token_ids)} token ids",
                )

    def resident(self, ids: Sequence[str], key: LineKey, field: str) -> int:
        """Every id names a block that lives in the cache, once; returns the token count."""
        seen: set[str] = set()
        total = 0
        for bid in ids:
            if bid not in self.by_id:
                raise self.fail(key, field, f"names block '{bid}', which the session does not hold")
            if bid in seen:
                raise self.fail(key, field, f"names block '{bid}' twice")
            if self.in_cache and self.by_id[bid].token_span is None:
                raise self.fail(key, field, f"names block '{bid}', which lives outside the cache")
            seen.add(bid)
            total += len(self.by_id[bid].token_ids)
        return total

    def manifests(self) -> int:
        """The final manifest (contiguous from 0 when recorded); returns the final cache's tokens."""
        final_tokens = self.resident(self.s.final_manifest, self.here, "final_manifest")
        if self.s.method is None and self.in_cache:
            _check_recorded_manifest(
                self.s.final_manifest, self.by_id, lambda m: self.fail(self.here, "final_manifest", m)
            )
        return final_tokens

    def checkpoints(self) -> None:
        """Unique ids, boundaries in 0..T, an offset equal to its manifest's tokens, no block from later."""
        seen: set[str] = set()
        for cp in self.trace.checkpoints:
            key: LineKey = (self.sid, "checkpoint", cp.id)
            if cp.id in seen:
                raise self.fail(key, "checkpoint.id", f"checkpoint '{cp.id}' appears twice")
            seen.add(cp.id)
            if not 0 <= cp.boundary <= self.T:
                raise self.fail(key, "checkpoint.boundary", f"boundary {cp.boundary} is outside 0..{self.T}")
            tokens = self.resident(cp.manifest, key, "checkpoint.manifest")
            if cp.token_offset != tokens:
                raise self.fail(
                    key,
                    "checkpoint.token_offset",
                    f"offset {cp.token_offset} is not the {tokens} tokens its manifest holds",
                )
            late = [bid for bid in cp.manifest if self.by_id[bid].turn > cp.boundary]
            if late:
                raise self.fail(
                    key, "checkpoint.manifest", f"block '{late[0]}' comes after the checkpoint's boundary"
                )

    def records(self, final_tokens: int) -> None:
        """Excised ranges, memory ids, observations, tool calls, ledgers and targets."""
        s, T, sid = self.s, self.T, self.sid
        for lo, hi in s.kv_excised:
            if not 0 <= lo < hi <= final_tokens:
                raise self.fail(
                    self.here,
                    "kv_excised",
                    f"range ({lo}, {hi}) is outside the final cache of {final_tokens} tokens",
                )
        ids = [m.id for m in s.memory_final]
        if len(set(ids)) != len(ids):
            raise self.fail(self.here, "memory_final", "a memory record id appears twice")
        for i, o in enumerate(self.trace.observations):
            key: LineKey = (sid, "observation", str(i))
            if not 0 <= o.t <= T:
                raise self.fail(key, "t", f"observation at t={o.t}, outside 0..{T}")
            if o.block_id not in self.by_id and s.method is None:  # (a method may drop the block)
                raise self.fail(key, "block_id", f"points at block '{o.block_id}', which the session lacks")
        for i, c in enumerate(self.trace.tool_calls):
            key = (sid, "tool_call", str(i))
            if not 0 <= c.turn <= T:
                raise self.fail(key, "turn", f"tool call at turn {c.turn}, outside 0..{T}")
            if c.block_id not in self.by_id and s.method is None:
                raise self.fail(key, "block_id", f"points at block '{c.block_id}', which the session lacks")
        for i, led in enumerate(self.trace.ledgers):
            counts = {
                "transitions_replayed": led.transitions_replayed,
                "tokens_reused": led.tokens_reused,
                "tokens_prefilled": led.tokens_prefilled,
                "tokens_decoded": led.tokens_decoded,
            }
            for name, value in counts.items():
                if value is not None and value < 0:
                    raise self.fail((sid, "ledger", str(i)), name, f"a negative count ({value})")
        for i, fr in enumerate(self.trace.forget_requests):
            if not fr.target.strip():
                raise self.fail((sid, "forget_request", str(i)), "target", "an empty target")
        if not s.target.value.strip():
            raise self.fail(self.here, "target.value", "an empty target")


def _check_recorded_manifest(
    manifest: Sequence[str], blocks: dict[str, Any], fail: Callable[[str], BadInput]
) -> None:
    """A recorded session's final cache is one timeline: its blocks' spans follow each other from 0, so a
    manifest that skips or reorders a block is refused."""
    at = 0
    for bid in manifest:
        start, end = blocks[bid].token_span
        if start != at:
            raise fail(
                f"block '{bid}' starts at {start} but the blocks before it end at {at} (a block is missing)"
            )
        at = end


def check_tokens(bundle: Bundle, tokenizer: Any, vocab_size: int) -> None:
    """Token ids inside the vocabulary, and every block's text exactly what its token ids say.

    The cache is rebuilt from the ids, so they are what a forget acts on; the text is what receipts and
    audits read. They agree when the ids are the text rendered as a message of the bundle's chat format
    (an observation, a system prompt, a summary: role markers around the text), or when the ids decode to
    the text once special tokens are dropped (a model turn). A block whose text was cut, emptied or
    edited while its ids kept the original is refused."""
    chat = detect_chat_format(tokenizer)
    for trace in bundle.sessions:
        sid = trace.session_id
        for b in trace.blocks:
            if not b.token_ids:
                continue
            key: LineKey = (sid, "block", b.id)
            bad = next((t for t in b.token_ids if not 0 <= t < vocab_size), None)
            if bad is not None:
                raise _refuse(
                    bundle,
                    key,
                    "block.token_ids",
                    f"session '{sid}': block '{b.id}' holds token id {bad}, outside the model's "
                    f"vocabulary of {vocab_size}",
                )
            if not _says(tokenizer, chat, b.token_ids, b.text):
                raise _refuse(
                    bundle,
                    key,
                    "block.text",
                    f"session '{sid}': block '{b.id}''s text is not what its token ids say (the cache is "
                    "rebuilt from the ids, so the two must agree)",
                )


def _says(tokenizer: Any, chat: ChatFormat, ids: list[int], text: str) -> bool:
    raw = str(tokenizer.decode(ids, skip_special_tokens=False))
    if raw in _renderings(chat, text):
        return True
    return bool(str(tokenizer.decode(ids, skip_special_tokens=True)).strip() == text)


def _renderings(chat: ChatFormat, text: str) -> set[str]:
    """Every way the runtime renders a block's text as a segment (``runtime.agent``)."""
    out = set()
    for role in ("system", "user"):
        msg = chat.message(role, text)
        out |= {msg, chat.bos + msg, msg + chat.generation_prompt()}
    return out
