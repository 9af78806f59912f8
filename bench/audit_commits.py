"""The white-box audit of one states bundle by two commits, side by side in one run: wall time, the audits'
and the methods' time per session, and whether every number agrees.

    python bench/audit_commits.py STATES.jsonl --old 49b3994 [--new WORKTREE] [--k 3]

STATES.jsonl is a bundle of post-forget states (``eu-audit unlearn -m all``). ``--old`` is a commit of this
repository, checked out in a temporary worktree; ``--new`` a source tree (default: this checkout). Each
audits its own copy of the states (an audit resumes from a progress file beside its input, so the two
never share one), one after the other, with nothing else running. The states' probes, samples, choices,
values and the gates must be equal, up to the mask each run draws afresh for z (``[z:...]``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MASK = re.compile(r"\[z:[0-9a-f]+\]")


def audit(tree: Path, states: Path, folder: Path, k: int) -> tuple[float, dict[str, Any]]:
    folder.mkdir(parents=True)
    copy = folder / "states.jsonl"
    shutil.copyfile(states, copy)
    out = folder / "audit.json"
    argv = [sys.executable, "-m", "eu_audit.cli", "audit", str(copy), "--k", str(k), "--json", str(out)]
    t0 = time.perf_counter()
    # run from the tree itself: ``python -m`` puts the working folder first on sys.path, before PYTHONPATH
    subprocess.run(argv, env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree, capture_output=True)
    wall = time.perf_counter() - t0
    return wall, json.loads(out.read_text())


def comparable(report: dict[str, Any]) -> Any:
    states = [
        {k: v for k, v in s.items() if k not in ("audit_s", "answers_reused")} for s in report["states"]
    ]
    return json.loads(MASK.sub("[z]", json.dumps([states, report["gates"]])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("states", type=Path)
    ap.add_argument("--old", required=True, help="a commit of this repository")
    ap.add_argument("--new", type=Path, default=ROOT, help="a source tree (default: this checkout)")
    ap.add_argument("--k", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old_tree = Path(tmp) / "old-tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(old_tree), args.old])
        try:
            runs = {
                "old": audit(old_tree, args.states, Path(tmp) / "old", args.k),
                "new": audit(args.new, args.states, Path(tmp) / "new", args.k),
            }
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old_tree)])
    same = comparable(runs["old"][1]) == comparable(runs["new"][1])
    first = runs["old"][1]
    print(
        f"{first['cost']['states']} states, {len({s['session_id'] for s in first['states']})} sessions, "
        f"k = {args.k}, engine {first['cost']['engine']}; every number equal: {'yes' if same else 'NO'}"
    )
    for side, (wall, rep) in runs.items():
        cost = rep["cost"]
        print(
            f"  {side}: wall {wall:6.1f} s ({cost['wall_s_per_session']} s per session), the audits' "
            f"{cost['audit_s']} s, answers reused for {cost.get('answers_reused', 0)} states"
        )
    print(f"  old / new: wall {runs['old'][0] / runs['new'][0]:.2f}x")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
