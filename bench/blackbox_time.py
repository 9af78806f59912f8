"""Where a black-box gate's wall time goes, read from the serve log of one run (no model runs here).

Each model call the agent made is in ``eu-audit serve``'s log with the harness's mark (tenant ``agent`` or
the ``b5`` reference; phase: the stream, the future turns, probes, samples, choices), its wall time and its
token usage. This groups them, so a team can see what a session costs by kind of call and size its CI job:

    python bench/blackbox_time.py OUT/serve.jsonl --record-s 97 --sessions 2
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", type=Path, help="the serve log (--log) of one record --agent run")
    ap.add_argument("--record-s", type=float, help="record --agent's wall time (run.json's record_s)")
    ap.add_argument("--sessions", type=int, default=1, help="sessions (episodes) the run drove")
    args = ap.parse_args()

    rows: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0, 0, 0])
    finishes: dict[str, int] = defaultdict(int)
    for line in args.log.read_text().splitlines():
        e = json.loads(line)
        mark = e.get("mark") or {}
        usage = e.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        r = rows[(mark.get("method", "-"), mark.get("phase", "-"))]
        r[0] += 1
        r[1] += (e.get("ms") or 0) / 1000
        r[2] += usage.get("prompt_tokens", 0) - cached
        r[3] += usage.get("completion_tokens", 0)
        r[4] += e.get("finish") in ("length", "repetition")
        finishes[str(e.get("finish"))] += 1
    total = sum(r[1] for r in rows.values())
    heads = ("calls", 6), ("model s", 8), ("share", 6), ("prefilled", 10), ("decoded", 8), ("at cap", 7)
    print(f"{'tenant':8} {'phase':8} " + " ".join(f"{h:>{w}}" for h, w in heads))
    for (tenant, phase), r in sorted(rows.items()):
        print(
            f"{tenant:8} {phase:8} {r[0]:6d} {r[1]:8.1f} {r[1] / total:6.0%} {r[2]:10d} {r[3]:8d} {r[4]:7d}"
        )
    calls = sum(r[0] for r in rows.values())
    print(f"model calls {calls}, {calls / args.sessions:.0f} per session; model time {total:.1f} s")
    if args.record_s:
        print(f"record --agent wall {args.record_s:.0f} s: model calls {total / args.record_s:.0%} of it")
    print("finish reasons:", dict(finishes))


if __name__ == "__main__":
    main()
