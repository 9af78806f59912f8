"""Exactness and serving-layer residue on a served engine, measured on the token ids the server returns.

For each server mode it records a suite with ``--engine openai``, applies B5 and B7, and prints per mode:
how many sessions B7 equals B5 token for token (every re-decoded turn), whether the server reported its
prefix reuse, and the serving-layer residue of the prefix that carried z (extra cached tokens vs a
same-length decoy) before and after the server's own reset.

    # a vLLM server on a GPU machine: batch-invariant mode on and off, prefix caching on
    python bench/served_exactness.py --vllm --model qwen2.5-coder-0.5b --suite builtin,bfcl-memory --n 8
    # an already running server (vLLM, SGLang, llama.cpp), one mode
    python bench/served_exactness.py --server http://127.0.0.1:8000 --model qwen2.5-coder-0.5b
    # the CPU check: llama.cpp's own server (the xllamacpp wheel) started here
    python bench/served_exactness.py --llamacpp --model smollm2-135m

``--vllm`` serves the model eu-audit ships from its de-quantized Hugging Face folder (the same weights
and tokenizer the client side uses), ``vllm serve DIR --enable-prefix-caching
--enable-prompt-tokens-details --seed 0``, once with ``VLLM_BATCH_INVARIANT=1`` and once without. vLLM
must be installed in this Python (``pip install vllm``); nothing else is downloaded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from eu_audit.audits.serving import measure
from eu_audit.bundle.io import read_bundle
from eu_audit.engines.llamacpp_server import free_port, running, wait_healthy
from eu_audit.engines.served import OpenAIEngine, Server
from eu_audit.models import load_model, prepare, resolve_model
from eu_audit.record import RecordOptions, record
from eu_audit.unlearn import unlearn


@dataclass
class ModeResult:
    mode: str
    sessions: int
    b7_equals_b5: int
    reuse_reported: bool
    residual_before_reset: list[int | None]
    residual_after_reset: list[int | None]
    reset_call: str
    record_s: float
    unlearn_s: float


def check(mode: str, url: str, model: str, suite: str, n: int, concurrency: int, work: Path) -> ModeResult:
    src = work / f"{mode}.jsonl"
    t0 = time.perf_counter()
    record(RecordOptions(suite=suite, n=n, model=model, engine="openai", server=url,
                         concurrency=concurrency, out=src))  # fmt: skip
    t1 = time.perf_counter()
    out = unlearn(src, ["b5", "b7"], work / f"{mode}.unlearned.jsonl").bundle
    t2 = time.perf_counter()
    by = {s.session_id: s for s in out.sessions}
    traces = read_bundle(src).sessions
    equal, reported = 0, True
    for s in traces:
        b5, b7 = by[f"{s.session_id}/b5"], by[f"{s.session_id}/b7"]
        turns = [[b.token_ids for b in t.blocks if b.derived and b.token_span] for t in (b5, b7)]
        equal += turns[0] == turns[1]
        reported &= b7.ledgers[0].tokens_reused is not None
    engine = OpenAIEngine(load_model(model, tokenizer_only=True), Server(url))
    before, after, call = [], [], ""
    for s in traces:
        r = measure(engine, s)
        before.append(r.residual_cached_tokens)
        after.append(r.residual_after_reset)
        call = r.reset_call
    return ModeResult(mode, len(traces), equal, reported, before, after, call, t1 - t0, t2 - t1)


@contextlib.contextmanager
def vllm_server(hf_dir: Path, *, invariant: bool, log: Path) -> Iterator[str]:
    port = free_port()
    env = dict(os.environ, VLLM_BATCH_INVARIANT="1" if invariant else "0")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(hf_dir),
           "--host", "127.0.0.1", "--port", str(port), "--seed", "0", "--dtype", "bfloat16",
           "--enable-prefix-caching", "--enable-prompt-tokens-details",
           "--max-model-len", "8192"]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, timeout=900)
            yield url
        finally:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=60)
            proc.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--vllm", action="store_true", help="start vLLM here, batch-invariant on and off")
    where.add_argument("--llamacpp", action="store_true", help="start llama.cpp's server (xllamacpp) here")
    where.add_argument("--server", help="an already running OpenAI-compatible server")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--suite", default="builtin")
    ap.add_argument("--n", type=int, default=2, help="sessions per suite")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--json", type=Path, help="also write the results as JSON")
    args = ap.parse_args()

    results: list[ModeResult] = []
    with tempfile.TemporaryDirectory(prefix="eu-audit-served-") as tmp:
        work = Path(tmp)
        if args.server:
            results.append(
                check("server", args.server, args.model, args.suite, args.n, args.concurrency, work)
            )
        elif args.llamacpp:
            with running(args.model) as url:
                results.append(check("llamacpp-cpu", url, args.model, args.suite, args.n, 1, work))
        else:
            hf_dir = prepare(resolve_model(args.model), "hf")
            for invariant in (True, False):
                mode = "vllm-batch-invariant" if invariant else "vllm-default"
                with vllm_server(hf_dir, invariant=invariant, log=Path(f"{mode}.log")) as url:
                    results.append(check(mode, url, args.model, args.suite, args.n, args.concurrency, work))

    print(f"model {args.model}, suite {args.suite}, n {args.n} per suite")
    print(f"{'mode':24} {'B7==B5':>9} {'reuse':>9} {'residue before':>15} {'after reset':>12} reset")
    for r in results:
        before = sum(1 for x in r.residual_before_reset if x)
        after = sum(1 for x in r.residual_after_reset if x)
        reuse = "reported" if r.reuse_reported else "unknown"
        print(f"{r.mode:24} {r.b7_equals_b5:>4}/{r.sessions:<4} {reuse:>9} "
              f"{before:>8}/{r.sessions:<6} {after:>5}/{r.sessions:<6} {r.reset_call}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
