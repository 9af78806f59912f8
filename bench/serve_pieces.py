"""What ``eu-audit serve --piece-tokens`` saves an agent whose system prompt changes only at its end.
Letta's does: its base instructions and memory blocks (about 1,700 tokens) end with the time its memory
was last modified and the count of stored messages, so no two calls share the whole first message. With
whole messages serve reuses nothing of such a prompt; with pieces it reuses the unchanged leading ones.

Two request sequences, each sent to a server prefilling whole messages (``--piece-tokens 0``) and to one
prefilling pieces (``--piece-tokens N``), the two alternating call by call so machine noise hits both:

* ``tail``: the system prompt's last line changes on every call (Letta's case), the history grows;
* ``head``: its first line changes, so nothing can be reused: what pieces cost when they save nothing.

    python bench/serve_pieces.py --model qwen2.5-coder-0.5b --calls 6 --piece 512

Prints, per sequence and configuration, seconds per call and prompt tokens served from the cache, and the
ratios.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from serve_client import post, start

RULE = "When a user shares a durable fact about themselves, keep it in your memory block for later turns. "


def messages(kind: str, i: int, instructions: str) -> list[dict[str, str]]:
    """Call ``i`` of a sequence: the system prompt (changing at its end or its start) and the history."""
    stamp = f"Memory blocks were last modified: 2026-12-04 16:{i:02d}:00; {4 * i} messages in recall memory."
    system = f"{instructions}\n{stamp}" if kind == "tail" else f"{stamp}\n{instructions}"
    history = [{"role": "system", "content": system}]
    for k in range(i + 1):
        history.append({"role": "user", "content": f"Errand {k}: pick up parcel {k} at counter {k + 3}."})
        history.append({"role": "assistant", "content": f"Noted: parcel {k}, counter {k + 3}."})
    history.append({"role": "user", "content": "What is left for today?"})
    return history


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--calls", type=int, default=6, help="calls per sequence and configuration")
    ap.add_argument("--piece", type=int, default=512, help="the pieces' size, in tokens")
    ap.add_argument("--instructions", type=int, default=1700, help="about this many tokens of fixed prompt")
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()
    instructions = RULE * max(1, args.instructions // 20)
    levels = (0, args.piece)
    kinds = ("tail", "head")
    with tempfile.TemporaryDirectory() as tmp:
        servers = {
            p: start(args.model, ["--piece-tokens", str(p)], Path(tmp) / f"control-{p}") for p in levels
        }
        try:
            for p in levels:  # warm: load costs and each sequence's first, cold prefill
                for kind in kinds:
                    post(servers[p][1], messages(kind, 0, instructions), 4)
            totals = {(kind, p): [0.0, 0, 0] for kind in kinds for p in levels}
            for i in range(1, args.calls + 1):
                for kind in kinds:
                    for p in levels:
                        wall, prompt, cached = post(
                            servers[p][1], messages(kind, i, instructions), args.max_tokens
                        )
                        t = totals[(kind, p)]
                        t[0], t[1], t[2] = t[0] + wall, t[1] + prompt, t[2] + cached
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(timeout=60)
    print(f"model {args.model}, {args.calls} calls per sequence, max_tokens {args.max_tokens}")
    print("| sequence | --piece-tokens | s per call | prompt tokens | served from cache |")
    print("|---|---|---|---|---|")
    for kind in kinds:
        for p in levels:
            wall, prompt, cached = totals[(kind, p)]
            share = cached / max(prompt, 1)
            print(f"| {kind} | {p} | {wall / args.calls:.2f} | {prompt} | {cached} ({share:.0%}) |")
    for kind in kinds:
        ratio = totals[(kind, 0)][0] / totals[(kind, args.piece)][0]
        print(f"{kind}: whole messages / pieces of {args.piece} = {ratio:.2f}x")


if __name__ == "__main__":
    main()
