"""What serve's per-family KV caches save an agent whose memory library sends a long fixed prompt of its
own between the agent's chat calls (mem0 at ``infer=True``: 8k tokens of extraction instructions before
every ``Memory.add``). The same request sequence, side by side in one run, against ``eu-audit serve
--lane-caches 1`` (one cache: every switch between the two prompts prefills the other one again, as serve
did before it kept a cache per opening message) and ``--lane-caches 8`` (each family keeps its prefix).
The two configurations alternate round by round, each on a server of its own, so machine noise hits both.

    python bench/serve_prompt_families.py --model smollm2-135m --rounds 6 --instructions 5000

Prints, per configuration, wall seconds per round (one chat call plus one extraction call), prompt
tokens served from the cache, and the ratio.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from serve_client import post, start

RULE = "Extract every durable fact about the user from the new messages as one JSON object per fact. "


def one_round(url: str, i: int, instructions: str, max_tokens: int) -> tuple[float, int, int]:
    """The agent answers turn ``i`` (its history so far), then its memory library extracts from it."""
    history = [{"role": "system", "content": "You are a personal assistant. Keep answers short."}]
    for k in range(i + 1):
        history.append({"role": "user", "content": f"Errand {k}: pick up parcel {k} at counter {k + 3}."})
    wall, prompt, cached = post(url, history, max_tokens)
    extract = [
        {"role": "system", "content": instructions},
        {
            "role": "user",
            "content": f"New messages:\nuser: Errand {i}: pick up parcel {i} at counter {i + 3}.",
        },
    ]
    w2, p2, c2 = post(url, extract, max_tokens)
    return wall + w2, prompt + p2, cached + c2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--instructions", type=int, default=5000, help="about this many tokens of fixed prompt")
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()
    instructions = RULE * max(1, args.instructions // 20)
    levels = (1, 8)
    with tempfile.TemporaryDirectory() as tmp:
        servers = {
            c: start(args.model, ["--lane-caches", str(c)], Path(tmp) / f"control-{c}") for c in levels
        }
        try:
            for c in levels:  # warm: load costs and the first, cold prefill of each family
                one_round(servers[c][1], 0, instructions, 4)
            fixed = post(servers[8][1], [{"role": "system", "content": instructions}], 1)[1]
            totals = {c: [0.0, 0, 0] for c in levels}
            for i in range(1, args.rounds + 1):
                for c in levels:
                    wall, prompt, cached = one_round(servers[c][1], i, instructions, args.max_tokens)
                    t = totals[c]
                    t[0], t[1], t[2] = t[0] + wall, t[1] + prompt, t[2] + cached
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(timeout=60)
    print(
        f"model {args.model}, {args.rounds} rounds (a chat call + an extraction call each), "
        f"fixed extraction prompt {fixed} tokens"
    )
    print("| --lane-caches | s per round | prompt tokens | served from cache |")
    print("|---|---|---|---|")
    for c in levels:
        wall, prompt, cached = totals[c]
        print(f"| {c} | {wall / args.rounds:.2f} | {prompt} | {cached} ({cached / max(prompt, 1):.0%}) |")
    print(f"speed-up of 8 over 1: {totals[1][0] / totals[8][0]:.2f}x")


if __name__ == "__main__":
    main()
