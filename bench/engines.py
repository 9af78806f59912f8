"""llamacpp vs hf, side by side in one run: prefill and decode tokens/s on the same model and prompt, the
llamacpp engine against llama.cpp's own decode loop on the same wheel, and optionally the wall time of
``audit`` on the built-in suite with each engine.

    python bench/engines.py --model qwen2.5-coder-0.5b --decode 48 --repeats 3
    python bench/engines.py --model smollm2-135m --decode 64 --repeats 3 --audit

Runs are interleaved (hf, llamacpp, bare llama.cpp, ...) so machine noise hits every side; medians are
reported. Tokens differ between engines (hf runs the de-quantized fp32 weights, llama.cpp the Q4 GGUF),
so each engine is checked against its own bare loop, not against the other engine.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from eu_audit.engines import Sampling
from eu_audit.engines.hf import HFEngine, bare_decode_loop
from eu_audit.engines.llamacpp import LlamaCppEngine, bare_generate, wheel_version
from eu_audit.models import load_gguf_model, load_model

PROMPT = (
    "<|im_start|>system\nYou are a personal assistant agent acting for one user.<|im_end|>\n"
    "<|im_start|>user\n" + "Here are my errands for the week: groceries, dry cleaning, dentist, "
    "library books, car service. " * 6 + "Write a short plan for Monday.<|im_end|>\n<|im_start|>assistant\n"
)


def engine_run(
    engine: HFEngine | LlamaCppEngine, ids: list[int], n: int
) -> tuple[list[int], float, float, float]:
    engine.reset()
    t0 = time.perf_counter()
    engine.prefill(ids)
    t1 = time.perf_counter()
    out = engine.decode(max_tokens=n, stop_ids=[], sampling=Sampling())
    t2 = time.perf_counter()
    engine.commit(len(ids), out)
    t3 = time.perf_counter()
    return out, t1 - t0, t2 - t1, t3 - t2


def audit_wall(model: str, engine: str) -> float:
    from eu_audit.audit import AuditOptions, audit
    from eu_audit.record import RecordOptions, record

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "trace.jsonl"
        t0 = time.perf_counter()
        record(RecordOptions(suite="builtin", model=model, engine=engine, out=src))
        audit(src, AuditOptions(methods=["b0", "b1", "b5", "b7"], k=5))
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--decode", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--audit", action="store_true", help="also time record + audit of the builtin suite")
    args = ap.parse_args()
    n = args.decode
    hf = HFEngine(load_model(args.model))
    ll = LlamaCppEngine(load_gguf_model(args.model))
    ids = hf.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    engine_run(hf, ids, 4)  # warm-up
    engine_run(ll, ids, 4)
    runs: dict[str, list[tuple[list[int], float, float]]] = {"hf": [], "llamacpp": [], "bare llama.cpp": []}
    bare_hf = []
    for _ in range(args.repeats):
        h = engine_run(hf, ids, n)
        runs["hf"].append(h[:3])
        bare_hf.append(bare_decode_loop(hf.model, ids, n))
        lc = engine_run(ll, ids, n)
        runs["llamacpp"].append(lc[:3])
        runs["bare llama.cpp"].append(bare_generate(ll, ids, n))
    assert all(r[0] == b[0] for r, b in zip(runs["hf"], bare_hf, strict=True)), "hf engine != its bare loop"
    assert all(r[0] == b[0] for r, b in zip(runs["llamacpp"], runs["bare llama.cpp"], strict=True)), (
        "llamacpp engine != llama.cpp's own loop"
    )
    med = statistics.median
    fwd = n - 1
    print(
        f"model {args.model}, prompt {len(ids)} tokens, decode {n} tokens, median of {args.repeats}; "
        f"torch {torch.__version__} threads {torch.get_num_threads()}; ik-llama-cpp-python {wheel_version()} "
        f"threads {ll.n_threads}"
    )
    rates = {}
    for name, rs in runs.items():
        pre, dec = med(r[1] for r in rs), med(r[2] for r in rs)
        rates[name] = (len(ids) / pre, fwd / dec)
        print(f"{name:15s} prefill {rates[name][0]:8.1f} tok/s   decode {rates[name][1]:7.1f} tok/s")
    print(
        f"llamacpp / hf:             prefill {rates['llamacpp'][0] / rates['hf'][0]:.2f}x   "
        f"decode {rates['llamacpp'][1] / rates['hf'][1]:.2f}x"
    )
    print(
        f"llamacpp / bare llama.cpp: prefill {rates['llamacpp'][0] / rates['bare llama.cpp'][0]:.3f}x   "
        f"decode {rates['llamacpp'][1] / rates['bare llama.cpp'][1]:.3f}x"
    )
    print("each engine's tokens equal its bare loop's: yes")
    if args.audit:
        walls = {e: audit_wall(args.model, e) for e in ("hf", "llamacpp")}
        print(
            f"record + audit (builtin, b0 b1 b5 b7, k=5): hf {walls['hf']:.0f} s, llamacpp "
            f"{walls['llamacpp']:.0f} s ({walls['hf'] / walls['llamacpp']:.1f}x)"
        )


if __name__ == "__main__":
    main()
