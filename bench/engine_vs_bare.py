"""Engine vs a bare transformers loop: prefill and decode tokens/s on the same model, one run.

    python bench/engine_vs_bare.py --model qwen2.5-coder-0.5b --decode 64 --repeats 3

Both sides run the same prompt, greedy, the same number of forward passes; runs are interleaved so
machine noise hits both. The engine adds what the runtime needs (accounting, the canonical commit of
a turn); the commit prefill is reported separately, since a bare loop has no equivalent.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from eu_audit.engines import Sampling
from eu_audit.engines.hf import HFEngine, bare_decode_loop
from eu_audit.models import load_model

PROMPT = (
    "<|im_start|>system\nYou are a personal assistant agent acting for one user.<|im_end|>\n"
    "<|im_start|>user\n" + "Here are my errands for the week: groceries, dry cleaning, dentist, "
    "library books, car service. " * 6 + "Write a short plan for Monday.<|im_end|>\n<|im_start|>assistant\n"
)


def engine_run(loaded, ids: list[int], n: int) -> tuple[list[int], float, float, float]:  # type: ignore[no-untyped-def]
    e = HFEngine(loaded)
    t0 = time.perf_counter()
    e.prefill(ids)
    t1 = time.perf_counter()
    out = e.decode(max_tokens=n, stop_ids=[], sampling=Sampling())
    t2 = time.perf_counter()
    e.commit(len(ids), out)
    t3 = time.perf_counter()
    return out, t1 - t0, t2 - t1, t3 - t2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    loaded = load_model(args.model, dtype=args.dtype)
    ids = loaded.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    n = args.decode
    engine_runs, bare_runs = [], []
    engine_run(loaded, ids, 4)  # warm-up, both paths share the kernels
    for _ in range(args.repeats):
        engine_runs.append(engine_run(loaded, ids, n))
        bare_runs.append(bare_decode_loop(loaded.model, ids, n))
    assert all(r[0] == b[0] for r, b in zip(engine_runs, bare_runs, strict=True)), (
        "engine and bare loop disagree"
    )
    med = statistics.median
    e_pre, e_dec = med(r[1] for r in engine_runs), med(r[2] for r in engine_runs)
    b_pre, b_dec = med(r[1] for r in bare_runs), med(r[2] for r in bare_runs)
    commit = med(r[3] for r in engine_runs)
    fwd = n - 1  # forward passes in the decode phase (the last token is fed by the commit)
    print(
        f"model {args.model} ({args.dtype}), torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"prompt {len(ids)} tokens, decode {n} tokens, median of {args.repeats}"
    )
    print(
        f"prefill tok/s  engine {len(ids) / e_pre:8.1f}   bare {len(ids) / b_pre:8.1f}   "
        f"ratio {b_pre / e_pre:.3f}"
    )
    print(f"decode  tok/s  engine {fwd / e_dec:8.1f}   bare {fwd / b_dec:8.1f}   ratio {b_dec / e_dec:.3f}")
    print(
        f"turn commit (re-prefill of {n} tokens): {commit:.3f} s = {100 * commit / e_dec:.1f}% of decode time"
    )
    print("identical tokens: yes")


if __name__ == "__main__":
    main()
