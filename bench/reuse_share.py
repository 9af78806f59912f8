"""What answering identical greedy requests once (``eu_audit.serve.reuse``) saves on a recorded run: from
a serve log written without reuse, the calls whose prompt (``prompt_digest``: the token ids the engine
received) a greedy, unconstrained call had already sent, and the share of serve's decoding time they took.

    python bench/reuse_share.py OUT/serve.jsonl     # e.g. a tools/gate.sh run's log

Both shares are of the same run's generation calls, measured side by side in one log.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def shares(log: Path) -> dict[str, float]:
    seen: set[str] = set()
    calls = repeats = 0
    ms_all = ms_repeat = 0.0
    for line in log.read_text().splitlines():
        e = json.loads(line)
        if e.get("endpoint") != "/v1/chat/completions" or int(e.get("status", 200)) >= 400:
            continue
        calls += 1
        ms = float(e.get("ms") or 0.0)
        ms_all += ms
        greedy = float((e.get("decoding") or {}).get("temperature") or 0.0) == 0.0
        if not greedy or e.get("response_format") or e.get("tool_choice") or not e.get("prompt_digest"):
            continue
        if e["prompt_digest"] in seen:
            repeats += 1
            ms_repeat += ms
        seen.add(e["prompt_digest"])
    return {
        "calls": calls,
        "repeated": repeats,
        "call_share": repeats / calls if calls else 0.0,
        "time_share": ms_repeat / ms_all if ms_all else 0.0,
    }


if __name__ == "__main__":
    for path in sys.argv[1:]:
        s = shares(Path(path))
        print(
            f"{path}: {s['repeated']:.0f} of {s['calls']:.0f} generation calls repeat an earlier greedy "
            "prompt "
            f"({s['call_share']:.1%}); their decoding took {s['time_share']:.1%} of serve's generation time"
        )
