"""Where a white-box audit's time goes: one ``eu-audit audit`` under cProfile, its time split by phase.

    python bench/audit_profile.py STATES.jsonl [--k 3]

STATES.jsonl is a bundle of post-forget states (``eu-audit unlearn -m all``); it is copied first, so the
audit's progress file never touches it. Printed: the audit's wall time, and the cumulative time of each
phase of ``audit_state`` (rebuilding a state's cache, the memory it retrieves, decoding its probes, samples
and choices as branches, the metrics), each with its share of the states' audit time and its call count.
Phases overlap where one calls the other (``prefill`` runs inside both the rebuild and the asks).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: (label, function name, a part of its file's path): the phases of one state's audit
PHASES = (
    ("every state's audit", "audit_state", "eu_audit/audit.py"),
    ("rebuild the state's cache", "rebuild", "eu_audit/trace/state.py"),
    ("retrieve its memory", "memory_context", "eu_audit/audit.py"),
    ("ask: probes, samples, choices", "ask_all", "eu_audit/audits/probes.py"),
    ("  of which prefill (rebuild and asks)", "prefill", "eu_audit/engines/schedule.py"),
    ("MiniLM embeddings (memory, embed metric)", "embed", "eu_audit/audits/embed.py"),
    ("what the state says of z (artifacts)", "artifact_leak", "eu_audit/audits/leakage.py"),
    ("CAD", "cad", "eu_audit/audits/metrics.py"),
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("states", type=Path)
    ap.add_argument("--k", type=int, default=3)
    args = ap.parse_args()
    from eu_audit.audit import AuditOptions, audit

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / args.states.name
        shutil.copy(args.states, copy)
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        rep = audit(copy, AuditOptions(k=args.k))
        prof.disable()
        wall = time.perf_counter() - t0
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    sessions = len({s.session_id for s in rep.states})
    per = wall / sessions
    print(f"audit wall {wall:.1f} s, {len(rep.states)} states, {sessions} session(s): {per:.1f} s a session")
    total = None
    for label, name, where in PHASES:
        cum = [(v[3], v[1]) for (f, _, n), v in stats.items() if n == name and where in f]
        t, calls = (sum(c for c, _ in cum), sum(n for _, n in cum)) if cum else (0.0, 0)
        total = total or t
        share = f"{t / total:6.1%}" if total else "   -  "
        print(f"{label:40s} {t:7.1f} s  {share}  ({calls} calls)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
