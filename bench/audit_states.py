"""An audit's per-state work three ways, side by side on the same states.

    python bench/audit_states.py STATES.jsonl --k 5 --max-tokens 24 --repeat 2

STATES.jsonl is a bundle of post-forget states (``<bundle>.audit-states.jsonl``, written by
``eu-audit audit`` or ``eu-audit unlearn -m all``), on the engine and model it records. For every state
(one session's states back to back), the six probes and k samples of the task request:

  apart:    rebuild from an empty cache, then every probe and sample as its own branch (prompt included)
  shared:   rebuild keeping the segments the previous state shares (StateBuilder); probes and samples one
            by one, the k samples branching from one prefill of their prompt
  batched:  as shared, but every branch decoded together (llamacpp's decode_branches)
  reused:   as batched, but a state that is an earlier one token for token, memory and questions included
            (``eu_audit.audit.answers_key``), given that state's answers: what ``eu-audit audit`` does now

apart and shared should give the same ids (the script counts the branches that do), reused must give
batched's; batched must give the same ids on every repeat (it is deterministic, not bitwise the
one-by-one run). Prints wall time and prefilled tokens per way and the ratios to apart, median of
--repeat runs interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eu_audit.audit import answers_key
from eu_audit.audits.probes import Ask, ProbeRunner, load_probes, task_request
from eu_audit.bundle.io import read_bundle
from eu_audit.engines import KVEngine, Sampling
from eu_audit.trace.session import SessionTrace
from eu_audit.trace.state import StateBuilder, rebuild_state
from eu_audit.unlearn import engine_for

Ids = list[list[int]]


class OneByOne:
    """The engine with its branch batching hidden: ask_all then runs branches one by one."""

    def __init__(self, engine: KVEngine) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        if name == "decode_branches":
            raise AttributeError(name)
        return getattr(self._engine, name)


def asks(trace: SessionTrace, k: int, n: int) -> list[Ask]:
    ep = trace.session.episode
    probes = [Ask(*p.render(ep), p.max_tokens) for p in load_probes()]
    return probes + [Ask(task_request(ep), None, n, Sampling(0.7, seed)) for seed in range(k)]


def apart(engine: KVEngine, traces: list[SessionTrace], k: int, n: int) -> Ids:
    runner = ProbeRunner.for_engine(OneByOne(engine))  # type: ignore[arg-type]
    out: Ids = []
    for t in traces:
        rebuild_state(engine, t)
        out += [runner.ask_ids(a.prompt, a.cue, a.max_tokens, a.sampling)[1] for a in asks(t, k, n)]
    return out


def _shared(runner: ProbeRunner, engine: KVEngine, traces: list[SessionTrace], k: int, n: int) -> Ids:
    builder, out = StateBuilder(engine), []
    for t in traces:
        builder.rebuild(t)
        out += [ids for _, ids in runner.ask_all(asks(t, k, n))]
    return out


def shared(engine: KVEngine, traces: list[SessionTrace], k: int, n: int) -> Ids:
    return _shared(ProbeRunner.for_engine(OneByOne(engine)), engine, traces, k, n)  # type: ignore[arg-type]


def batched(engine: KVEngine, traces: list[SessionTrace], k: int, n: int) -> Ids:
    return _shared(ProbeRunner.for_engine(engine), engine, traces, k, n)


def reused(engine: KVEngine, traces: list[SessionTrace], k: int, n: int) -> Ids:
    """As batched (shared where the engine runs branches one by one), a state that is an earlier one token
    for token (``answers_key``) given that state's answers, not rebuilt nor asked: ``eu-audit audit`` now."""
    runner, builder, out = ProbeRunner.for_engine(engine), StateBuilder(engine), []
    answered: dict[str, list[list[int]]] = {}
    for t in traces:
        questions = asks(t, k, n)
        key = answers_key(t, questions)
        if key not in answered:
            builder.rebuild(t)
            answered[key] = [ids for _, ids in runner.ask_all(questions)]
        out += answered[key]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("states", type=Path)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--sessions", type=int, help="only the first N recorded sessions' states")
    args = ap.parse_args()
    bundle = read_bundle(args.states)
    traces = sorted(bundle.sessions, key=lambda t: t.session.parent_session or t.session_id)
    if args.sessions:
        keep = list(dict.fromkeys(t.session.parent_session for t in traces))[: args.sessions]
        traces = [t for t in traces if t.session.parent_session in keep]
    engine = engine_for(bundle)
    ways: dict[str, Callable[[KVEngine, list[SessionTrace], int, int], Ids]] = {
        "apart": apart,
        "shared": shared,
    }
    if getattr(engine, "decode_branches", None):
        ways["batched"] = batched
    ways["reused"] = reused
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in ways}
    answers: dict[str, list[Ids]] = {name: [] for name in ways}
    for _ in range(args.repeat):
        for name, fn in ways.items():
            engine.reset()
            before, t0 = engine.account.copy(), time.perf_counter()
            answers[name].append(fn(engine, traces, args.k, args.max_tokens))
            runs[name].append((time.perf_counter() - t0, engine.account.since(before).prefilled))
    # one prefill per sample vs one shared by the k samples: equal on SmolLM2 (22 states x 11 branches);
    # on Qwen2.5-Coder-0.5B one T = 0.7 sample of 27 turned at its 4th token (bench/RESULTS.md)
    a, sh = answers["apart"][0], answers["shared"][0]
    same_branches = sum(x == y for x, y in zip(a, sh, strict=True))
    if "batched" in answers:
        assert all(a == answers["batched"][0] for a in answers["batched"]), "batched is not deterministic"
    same_as = "batched" if "batched" in answers else "shared"
    assert answers["reused"][0] == answers[same_as][0], f"reused differs from {same_as}"
    sessions = len({t.session.parent_session for t in traces})
    print(
        f"{len(traces)} states of {sessions} sessions on {engine.name} ({bundle.header.model.name}), "
        f"6 probes + k = {args.k} samples of {args.max_tokens} tokens per state, median of {args.repeat}; "
        f"apart == shared: {same_branches} of {len(a)} branches; reused == {same_as}: yes; "
        "batched the same on every repeat: "
        + (
            "n/a (the engine runs branches one by one)"
            if "batched" not in answers
            else ("yes" if args.repeat > 1 else "not checked (one repeat)")
        )
    )
    med = {n: (statistics.median(w for w, _ in r), r[0][1]) for n, r in runs.items()}
    base = med["apart"]
    for name, (wall, toks) in med.items():
        print(
            f"  {name:8s} wall {wall:7.1f} s   prefilled {toks:8d} tokens   "
            f"apart/{name}: wall {base[0] / wall:.2f}x, prefilled {base[1] / max(toks, 1):.2f}x"
        )


if __name__ == "__main__":
    main()
