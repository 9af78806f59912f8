"""An audit's per-state work, the old way and eu-audit's way, side by side on the same states.

    python bench/audit_states.py STATES.jsonl --k 5 --max-tokens 24 --repeat 2

STATES.jsonl is a bundle of post-forget states (``<bundle>.audit-states.jsonl``, written by
``eu-audit audit`` or ``eu-audit unlearn -m all``), on the engine and model it records. For every state,
one session's states back to back:

  apart:   rebuild from an empty cache, then k samples of the task request, each prefilling the prompt
  shared:  rebuild keeping the segments the previous state shares (StateBuilder), then the k samples as
           branches of one prompt prefill (ProbeRunner.ask_samples): what ``eu-audit audit`` does

The script checks both give the same sample tokens, and prints wall time, prefilled tokens and the
ratios apart/shared, median of --repeat runs interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from eu_audit.audits.probes import ProbeRunner, task_request
from eu_audit.bundle.io import read_bundle
from eu_audit.runtime.engine import KVEngine, Sampling
from eu_audit.trace import rebuild_state
from eu_audit.trace.session import SessionTrace
from eu_audit.trace.state import StateBuilder
from eu_audit.unlearn import engine_for

Samples = list[list[int]]


def apart(engine: KVEngine, traces: list[SessionTrace], samplings: list[Sampling], n: int) -> Samples:
    runner = ProbeRunner.for_engine(engine)
    out: Samples = []
    for t in traces:
        rebuild_state(engine, t)
        out += [runner.ask_ids(task_request(t.session.episode), None, n, s)[1] for s in samplings]
    return out


def shared(engine: KVEngine, traces: list[SessionTrace], samplings: list[Sampling], n: int) -> Samples:
    runner, builder = ProbeRunner.for_engine(engine), StateBuilder(engine)
    out: Samples = []
    for t in traces:
        builder.rebuild(t)
        out += [ids for _, ids in runner.ask_samples(task_request(t.session.episode), None, n, samplings)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("states", type=Path)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    bundle = read_bundle(args.states)
    traces = sorted(bundle.sessions, key=lambda t: t.session.parent_session or t.session_id)
    engine = engine_for(bundle)
    samplings = [Sampling(0.7, seed) for seed in range(args.k)]
    runs: dict[str, list[tuple[float, int]]] = {"apart": [], "shared": []}
    answers: dict[str, Samples] = {}
    for _ in range(args.repeat):
        for name, fn in (("apart", apart), ("shared", shared)):
            engine.reset()
            before, t0 = engine.account.copy(), time.perf_counter()
            answers[name] = fn(engine, traces, samplings, args.max_tokens)
            runs[name].append((time.perf_counter() - t0, engine.account.since(before).prefilled))
    assert answers["apart"] == answers["shared"], "the two ways gave different samples"
    sessions = len({t.session.parent_session for t in traces})
    print(
        f"{len(traces)} states of {sessions} sessions on {engine.name} ({bundle.header.model.name}), "
        f"k = {args.k} samples of {args.max_tokens} tokens, median of {args.repeat}; same samples: yes"
    )
    med = {n: (statistics.median(w for w, _ in r), r[0][1]) for n, r in runs.items()}
    for name, (wall, toks) in med.items():
        print(f"  {name:7s} wall {wall:7.1f} s   prefilled {toks:8d} tokens")
    a, s = med["apart"], med["shared"]
    print(f"  apart/shared: wall {a[0] / s[0]:.2f}x, prefilled tokens {a[1] / s[1]:.2f}x")


if __name__ == "__main__":
    main()
