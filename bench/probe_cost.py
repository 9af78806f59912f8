"""Leak@probes on a shared state vs one probe, side by side.

    python bench/probe_cost.py --model smollm2-135m --repeat 3

A recorded session is rebuilt from its token ids (the post-forget state an audit reads). Three ways to
probe it, measured in one process on the same state:
  single:  rebuild + 1 probe
  shared:  rebuild once + 6 probes, each a branch cropped back (what eu-audit does)
  naive:   6 x (rebuild + 1 probe)
The script prints wall time and recomputed tokens (prefilled + decoded) for each and the ratios
shared/single (the goal is <= 1.5x) and naive/shared.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from eu_audit.audits.probes import ProbeRunner, load_probes
from eu_audit.bundle.io import SessionTrace, read_bundle
from eu_audit.engines.hf import HFEngine
from eu_audit.models import LoadedModel, load_model
from eu_audit.record import RecordOptions, record
from eu_audit.trace.state import rebuild_state


def _measure(engine: HFEngine, fn) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    before = engine.account.copy()
    t0 = time.perf_counter()
    fn()
    spent = engine.account.since(before)
    return time.perf_counter() - t0, spent.prefilled + spent.decoded


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--bundle", type=Path, help="a recorded bundle (default: record the builtin suite)")
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens per probe answer (audit default 32)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--session", action="append", help="only these session ids (repeatable)")
    args = ap.parse_args()
    loaded: LoadedModel = load_model(args.model)
    path = args.bundle
    if path is None:
        path = Path(tempfile.mkdtemp()) / "trace.jsonl"
        record(RecordOptions(model=args.model, out=path), loaded=loaded)
    engine = HFEngine(loaded)
    runner = ProbeRunner.for_engine(engine)
    probes = load_probes()
    for trace in read_bundle(path).sessions:
        if args.session and trace.session_id not in args.session:
            continue
        ep = trace.session.episode

        def probe(i: int, trace: SessionTrace = trace) -> None:
            prompt, cue = probes[i].render(trace.session.episode)
            runner.ask(prompt, cue, args.max_tokens)

        def single(trace: SessionTrace = trace) -> None:
            rebuild_state(engine, trace)
            probe(0)

        def shared(trace: SessionTrace = trace) -> None:
            rebuild_state(engine, trace)
            for i in range(len(probes)):
                probe(i)

        def naive(trace: SessionTrace = trace) -> None:
            for i in range(len(probes)):
                rebuild_state(engine, trace)
                probe(i)

        rows = {}
        for name, fn in (("single", single), ("shared", shared), ("naive", naive)):
            runs = [_measure(engine, fn) for _ in range(args.repeat)]
            rows[name] = (statistics.median(r[0] for r in runs), runs[0][1])
        state_tokens = len(engine.tokens)
        print(
            f"{trace.session_id} {ep.id}: state {state_tokens} tokens, {len(probes)} probes, "
            f"{args.max_tokens} tokens each, median of {args.repeat}"
        )
        for name, (wall, toks) in rows.items():
            print(f"  {name:7s} wall {wall:7.2f} s   recomputed {toks:6d} tokens")
        s, o, n = rows["single"], rows["shared"], rows["naive"]
        print(
            f"  shared/single: wall {o[0] / s[0]:.2f}x, tokens {o[1] / s[1]:.2f}x   "
            f"naive/shared: wall {n[0] / o[0]:.2f}x, tokens {n[1] / o[1]:.2f}x"
        )


if __name__ == "__main__":
    main()
