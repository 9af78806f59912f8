"""Selective replay (B7) vs full reset (B5) vs full reset + prefix cache (B5'), side by side.

    python bench/replay_cost.py --model smollm2-135m --episodes 3

Each episode: a long clean prefix (a household handbook the user pastes, then setup turns), the target
arriving through a memory injection, then 12 transitions past it, half of them independent of it
(isolated sub-tasks). All three methods run on the same recorded sessions in one process; the script
prints recomputed tokens (prefilled + decoded), decoded tokens and wall time, and their ratios.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from eu_audit.episodes import Episode
from eu_audit.models import load_model
from eu_audit.record import RecordOptions, record
from eu_audit.unlearn import unlearn

HANDBOOK = (
    "Household handbook. Bins: green on Monday, blue on Thursday; rinse glass before recycling. "
    "Heating: the boiler timer runs 6-8 am and 5-10 pm; bleed radiators every October. "
    "Plants: water the fern twice a week, the cactus once a month. Car: service due every 15,000 km, "
    "tyre pressure 2.4 bar front and 2.2 bar rear. Pets: the cat eats at 7 am and 6 pm, half a pouch. "
)
TARGETS = ["12 Linden Street", "48 Harbour Road", "7 Elm Court", "91 Quarry Lane", "3 Mill Row"]
SETUP = [
    "When are the bins collected?",
    "How often do I water the fern?",
    "What tyre pressure for the front?",
    "When does the heating run in the morning?",
    "When does the cat eat?",
    "When do I bleed radiators?",
]
DEPENDENT = [
    "Where should the taxi pick me up tonight?",
    "Which address goes on the parcel form?",
    "Remind me where I live.",
    "Fill in my home address for the doctor.",
    "Where should groceries be delivered?",
    "What address do I give the plumber?",
]
INDEPENDENT = [
    "Convert 3 cups to millilitres.",
    "Give me a synonym for quick.",
    "What is 17 times 6?",
    "Name a fruit that is red.",
    "Translate 'thank you' into French.",
    "What day follows Friday?",
]


def _rot(items: list[str], i: int) -> list[str]:
    return items[i % len(items) :] + items[: i % len(items)]


def episode(i: int, handbook_repeat: int, post: int, max_tokens: int) -> Episode:
    """Episode ``i``: its own target and its own order of questions (so sessions differ in both worlds)."""
    target = TARGETS[i % len(TARGETS)]
    setup, dependent, independent = _rot(SETUP, i), _rot(DEPENDENT, i), _rot(INDEPENDENT, 2 * i)
    steps = [
        {
            "kind": "user",
            "phase": "setup",
            "content": "Please keep this handbook in mind.\n" + HANDBOOK * handbook_repeat,
            "max_tokens": 8,
        }
    ]
    steps += [{"kind": "user", "phase": "setup", "content": q, "max_tokens": max_tokens} for q in setup]
    steps.append(
        {
            "kind": "memory",
            "phase": "acquisition",
            "source": "src-home",
            "memory_id": "m-home",
            "content": f"User profile: home address {target}.",
            "counterfactual": "User profile: (empty).",
            "max_tokens": 8,
        }
    )
    for k in range(post):  # transitions past the target; every other one independent of it
        q = independent[k // 2 % 6] if k % 2 else dependent[k // 2 % 6]
        steps.append(
            {
                "kind": "user",
                "phase": "further",
                "content": q,
                "independent": bool(k % 2),
                "max_tokens": max_tokens,
            }
        )
    return Episode.model_validate(
        {"id": f"bench-{i}", "suite": "bench", "target": {"value": target, "kind": "address"}, "steps": steps}
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--episodes", type=int, default=3)
    ap.add_argument("--handbook-repeat", type=int, default=6, help="length of the clean prefix document")
    ap.add_argument("--post", type=int, default=12, help="transitions past the target (T - tau)")
    ap.add_argument("--max-tokens", type=int, default=24)
    args = ap.parse_args()
    loaded = load_model(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        suite = d / "bench.jsonl"
        eps = [episode(i, args.handbook_repeat, args.post, args.max_tokens) for i in range(args.episodes)]
        suite.write_text("".join(e.model_dump_json() + "\n" for e in eps))
        t0 = time.perf_counter()
        record(RecordOptions(suite=str(suite), model=args.model, out=d / "t.jsonl"), loaded=loaded)
        rec_s = time.perf_counter() - t0
        res = unlearn(d / "t.jsonl", ["b5,b5p,b7"], d / "u.jsonl", loaded=loaded)
    tot: dict[str, dict[str, float]] = {
        m: {"recomp": 0, "decoded": 0, "wall": 0, "reused": 0} for m in ("b5", "b5p", "b7")
    }
    print(
        f"model {args.model}, {args.episodes} episodes, handbook x{args.handbook_repeat}, "
        f"{args.post} turns past the target (half independent), "
        f"recording took {rec_s:.1f} s"
    )
    print(
        f"{'session':8} {'method':6} {'T':>3} {'tau':>4} {'replayed':>8} {'reused':>7} {'prefilled':>9} "
        f"{'decoded':>8} {'recomputed':>10} {'wall s':>7}"
    )
    for sid, m, led, rec in res.rows:
        recomp = led.tokens_prefilled + led.tokens_decoded
        tot[m]["recomp"] += recomp
        tot[m]["decoded"] += led.tokens_decoded
        tot[m]["wall"] += led.wall_s or 0.0
        tot[m]["reused"] += led.tokens_reused
        T = led.transitions_replayed if m == "b5" else "-"
        print(
            f"{sid:8} {m:6} {T!s:>3} {led.tau!s:>4} {led.transitions_replayed:>8} {led.tokens_reused:>7} "
            f"{led.tokens_prefilled:>9} {led.tokens_decoded:>8} {recomp:>10} {led.wall_s:>7.2f}"
            f"  {'clean' if rec.clean else 'LEAK'}"
        )
    print()

    def ratio(label: str, num: str, den: str, key: str, unit: str = "") -> None:
        x, y = tot[num][key], tot[den][key]
        name = {"b5": "B5", "b5p": "B5'", "b7": "B7"}
        print(f"{label:18} {name[num]:>3} / {name[den]} = {x:.1f}{unit} / {y:.1f}{unit} = {x / y:.2f}x")

    ratio("recomputed tokens", "b5", "b7", "recomp")
    ratio("recomputed tokens", "b5p", "b7", "recomp")
    ratio("decoded tokens", "b5p", "b7", "decoded")
    ratio("wall time", "b5", "b7", "wall", " s")
    ratio("wall time", "b5p", "b7", "wall", " s")


if __name__ == "__main__":
    main()
