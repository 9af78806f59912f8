"""What holding a reply to JSON costs `eu-audit serve` per decoded token: the same chat requests decoded
free and held to ``response_format: json_object`` (llguidance's token mask before every pick), the two
alternating request by request on one loaded model so machine noise hits both. Prints decoded tokens per
second for each, the ratio held / free, and the mask's own time per token.

    python bench/structured_output.py --model qwen2.5-coder-0.5b --requests 6 --max-tokens 96
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from eu_audit.engines.base import Sampling  # noqa: E402
from eu_audit.engines.constraint import JsonShape  # noqa: E402
from eu_audit.serve import open_backend  # noqa: E402

TOPICS = ["rivers", "bridges", "markets", "trains", "gardens", "museums", "harbours", "festivals"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--requests", type=int, default=6, help="requests per arm")
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()
    backend = open_backend(args.model, "llamacpp", None)
    greedy = Sampling(temperature=0.0)
    shape = JsonShape({"type": "object"}, "json_object")
    backend.compute(backend.structured, time.monotonic() + 600)  # the tokenizer, built once per server
    spent = {"free": 0.0, "held": 0.0}
    tokens = {"free": 0, "held": 0}
    masks: list[float] = []
    for i in range(args.requests):
        ask = f"Describe the {TOPICS[i % len(TOPICS)]} of city number {i} as a JSON object."
        segs = backend.segments.render([{"role": "user", "content": ask}], None)
        for arm in ("free", "held"):
            constraint = backend.structured().constraint(shape) if arm == "held" else None
            if constraint is not None:  # the mask alone, on the first token's logits shape
                logits = np.zeros(backend.vocab, dtype=np.float32)
                start = time.perf_counter()
                for _ in range(20):
                    constraint.restrict(logits)
                masks.append((time.perf_counter() - start) / 20)
            start = time.perf_counter()
            ids, _, _, _ = backend.generate(
                segs,
                args.max_tokens,
                greedy,
                lambda _: False,
                time.monotonic() + 600,
                f"{arm}{i}",
                constraint,
            )
            spent[arm] += time.perf_counter() - start
            tokens[arm] += len(ids)
    rate = {arm: tokens[arm] / spent[arm] for arm in spent}
    print(f"model {args.model}, {args.requests} requests per arm, up to {args.max_tokens} tokens each")
    for arm in ("free", "held"):
        print(f"  {arm}: {tokens[arm]} tokens in {spent[arm]:.1f} s = {rate[arm]:.1f} tok/s")
    print(f"  held / free: {rate['held'] / rate['free']:.2f}x")
    print(f"  the mask alone: {1000 * sum(masks) / len(masks):.2f} ms per token (vocabulary {backend.vocab})")
    backend.close()


if __name__ == "__main__":
    main()
