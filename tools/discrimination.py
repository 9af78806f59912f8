"""The gate's confusion matrix over agents of known truth: each agent run through the default gate
(``tools/gate.sh``: serve, the agent, ``record --agent --until-decided``, ``audit --gate-set forget``), one
row each (truth, verdict, exit, what it named, wall time, the n it stopped at), then the matrix of truth
against exit code.

    python tools/discrimination.py --out reports/discrimination                 # every agent, the defaults
    python tools/discrimination.py --only noop,audit-log --n 2 --out /tmp/disc  # a few, a pilot n
    python tools/discrimination.py --table-only --out reports/discrimination    # the table from the rows

A good agent must exit 0 and a bad one exit 1. Each agent's rows (``audit.json``, masked, and
``run.json``) are copied to OUT/rows/NAME/ as it finishes, so a run cut off goes on where it stopped (an
agent with rows is not run again); the bundle and serve's log hold the target and stay in the work folder.

A row run in slices (``tools/gate.sh`` with ``SESSIONS=FROM:TO``: a long run over several sessions, or a
finished one continued to a larger n) keeps each slice's audit and run beside the first's, as
``audit.sessions-FROM-TO.json`` and ``run.sessions-FROM-TO.json``; its row is the slices' audits merged
(``eu-audit merge``: every cell and p-value recomputed over all the sessions), its exit code that merge's
verdict on the rules the slices were gated with, its wall time their sum.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eu_audit.audits.gate import exit_code  # noqa: E402
from eu_audit.audits.merge import read_audits, shard_audits  # noqa: E402
from eu_audit.audits.model import AuditReport  # noqa: E402
from eu_audit.audits.rules import overall  # noqa: E402
from eu_audit.models import DEFAULT_MODEL  # noqa: E402


@dataclass(frozen=True)
class KnownAgent:
    name: str
    truth: str  # good | bad
    agent: str  # tools/gate.sh AGENT: eu-audit, or a folder of examples/agents
    forget: str  # its --forget
    why: str  # why its truth is what it is
    #: a release of the residue pack (``pack/CASE/case.toml``): its agent, arguments and pins, in a venv
    #: of its own (``eu_audit.pack.venvs``); "" for an agent of this checkout
    case: str = ""
    release: str = ""


def _pack(case: str, release: str, truth: str, why: str) -> KnownAgent:
    return KnownAgent(f"{case}-{release}", truth, "", "", why, case, release)


AGENTS = (
    KnownAgent("eu-audit-b7", "good", "eu-audit", "b7", "eu-audit's runtime, selective replay (B7 == B5)"),
    KnownAgent("minimal-remove", "good", "known-truth", "remove", "every memory and message with z removed"),
    KnownAgent("sqlite-vacuum", "good", "known-truth", "sqlite-vacuum", "SQLite DELETE, then VACUUM"),
    KnownAgent("noop", "bad", "known-truth", "none", "acknowledges the forget, removes nothing"),
    KnownAgent("eu-audit-b0", "bad", "eu-audit", "b0", "eu-audit's runtime with its forget switched off"),
    KnownAgent("audit-log", "bad", "known-truth", "audit-log", "keeps what it removed in an audit log"),
    KnownAgent("hide-dump", "bad", "known-truth", "hide-dump", "keeps the memory, leaves it out of its dump"),
    KnownAgent("over-delete", "bad", "known-truth", "over-delete", "removes every tenant's memories"),
    KnownAgent("sqlite-delete", "bad", "known-truth", "sqlite-delete", "SQLite DELETE, no VACUUM"),
    KnownAgent(
        "cache", "bad", "known-truth", "cache", "removes, keeps every text in a gzip cache it does not name"
    ),
    KnownAgent(
        "eu-audit-b1", "bad", "eu-audit", "b1", "eu-audit's runtime, deletes only the memory records (B1)"
    ),
    _pack("openai-agents-3755", "buggy", "bad", "openai-agents 0.18.2: clear_session leaves structure rows"),
    _pack("openai-agents-3755", "fixed", "good", "openai-agents 0.18.3: the fix, the session rewritten"),
    _pack("mem0-6512", "buggy", "bad", "mem0 2.2.1: delete_all leaves the history table's rows"),
    _pack("langgraph-8757", "buggy", "bad", "langgraph-checkpoint-sqlite 3.1.2: delete leaves store_vectors"),
    _pack("chroma-3793", "buggy", "bad", "chromadb 1.5.9 under mem0: delete leaves embeddings_queue rows"),
)
#: what a gate must answer for each truth
EXPECTED = {"good": 0, "bad": 1}
KEPT = ("audit.json", "run.json")


def pack_release(a: KnownAgent, out: Path) -> tuple[str, str, dict[str, str]]:
    """A pack release as gate.sh runs it: the agent's folder, its forget, and the environment naming its
    venv's Python and its arguments (the case's, then the release's, as ``eu-audit pack run`` gives them)."""
    from eu_audit.pack.case import load_case
    from eu_audit.pack.venvs import venv_for

    case = load_case(ROOT / "pack" / a.case / "case.toml")
    release = next(r for r in case.releases if r.name == a.release)
    out.mkdir(parents=True, exist_ok=True)
    python = venv_for([*release.pins, *case.requirements], case.python, log=out / "install.log")
    argv = [*case.agent_args, *release.agent_args]
    # gate.sh passes --forget FORGET first; the case's own --forget, later on the line, is the one parsed
    forget = next((argv[i + 1] for i in range(len(argv) - 1) if argv[i] == "--forget"), "")
    folder = Path(case.agent).parent.name
    default = {"mem0": "mem0", "openai-agents": "rewrite", "langgraph": "store"}[folder]
    env = {"AGENT_PYTHON": str(python), "AGENT_ARGS": " ".join(argv)}
    return folder, forget or default, env


def run_one(a: KnownAgent, args: argparse.Namespace, work: Path, rows: Path) -> None:
    out = work / a.name
    env_k = {"K": str(args.k), **({} if args.fixed_n else {"UNTIL": "1"})}
    agent, forget = a.agent, a.forget
    if a.case:
        agent, forget, env_pack = pack_release(a, out)
        env_k.update(env_pack)
    cmd = [
        "bash",
        str(ROOT / "tools/gate.sh"),
        agent,
        forget,
        args.suite,
        str(args.n),
        args.model,
        str(out),
    ]
    print(f"{a.name}: {' '.join(cmd[2:])}", flush=True)
    subprocess.run(cmd, check=False, env={**_env(), **env_k})
    rows.mkdir(parents=True, exist_ok=True)
    for name in KEPT:
        if (out / name).exists():
            shutil.copy(out / name, rows / name)


def _env() -> dict[str, str]:
    return dict(os.environ)


def audit_of(rows: Path) -> AuditReport | None:
    """A row's audit: ``audit.json``, merged with its later slices' audits where it was run in slices."""
    if not (rows / "audit.json").exists():
        return None
    return read_audits([p for p in shard_audits(rows) if p.name.startswith("audit")])


def runs_of(rows: Path) -> list[dict[str, object]]:
    """``run.json`` and each later slice's ``run.sessions-FROM-TO.json``."""
    return [json.loads(p.read_text()) for p in sorted(rows.glob("run*.json"))]


def row(a: KnownAgent, rows: Path) -> list[str]:
    runs = runs_of(rows)
    rep = audit_of(rows)
    if any(r["record_exit"] != 0 for r in runs):
        code = 3
    elif len(runs) > 1 and rep is not None:  # the slices merged are decided again on all their sessions
        code = exit_code(rep.gates)
    else:
        code = int(str(runs[0]["gate_exit"]))
    verdict, named = "run failed", ""
    if rep is not None:
        verdict = overall(g.outcome for g in rep.gates)
        failed = [g for g in rep.gates if g.outcome == "failed"]
        open_ = [g for g in rep.gates if g.outcome in ("inconclusive", "insensitive")]
        named = "; ".join(f"`{g.rule}`" for g in failed) or "; ".join(
            f"`{g.rule}` {g.outcome}" + (f" (n >= {g.n_needed})" if g.n_needed else "") for g in open_
        )
    ok = "yes" if code == EXPECTED[a.truth] else "**no**"
    wall = sum(int(str(r["record_s"])) + int(str(r["audit_s"])) for r in runs)
    return [a.name, a.truth, a.why, verdict, str(code), ok, named or "-", f"{wall} s", sessions(runs, rep)]


def sessions(runs: list[dict[str, object]], rep: AuditReport | None) -> str:
    """The n a run reached: "n = 1 of 30, stopped" where it ran in rounds and stopped on a failure;
    "n = 68, in 2 slices" where it was run in slices."""
    if len(runs) > 1:
        return f"n = {max(int(str(r['n'])) for r in runs)}, in {len(runs)} slices"
    stopped = rep.engine_facts.get("stopped") if rep is not None else None
    if isinstance(stopped, dict):
        early = ", stopped" if stopped.get("early") else ""
        return f"n = {stopped['n']} of {stopped['max_n']}{early}"
    return f"n = {runs[0]['n']}"


def table(agents: tuple[KnownAgent, ...], out: Path) -> list[str]:
    lines = [
        "| agent | truth | its forget | verdict | exit | as it must | what the gate named | wall | n |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    counts: dict[tuple[str, int], int] = {}
    missing = []
    for a in agents:
        rows = out / "rows" / a.name
        if not (rows / "run.json").exists():
            missing.append(a.name)
            continue
        r = row(a, rows)
        lines.append("| " + " | ".join(r) + " |")
        counts[(a.truth, int(r[4]))] = counts.get((a.truth, int(r[4])), 0) + 1
    lines += [
        "",
        "| truth \\ exit | 0 held | 1 failed | 4 undecided | 3 run failed |",
        "|---|---|---|---|---|",
    ]
    for truth in ("good", "bad"):
        lines.append(
            f"| {truth} | " + " | ".join(str(counts.get((truth, c), 0)) for c in (0, 1, 4, 3)) + " |"
        )
    if missing:
        lines += ["", f"Not run yet: {', '.join(missing)}."]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="the report folder (rows/ and README.md)")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--suite", default="bfcl-memory")
    ap.add_argument("--n", type=int, default=30, help="the most sessions (in rounds, until decided)")
    ap.add_argument("--fixed-n", action="store_true", help="record --n sessions whatever they show")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--only", default="", help="comma-separated agent names (default: all)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/eu-audit-discrimination"), help="bundles, logs")
    ap.add_argument("--table-only", action="store_true", help="write the table from the rows, run nothing")
    args = ap.parse_args()
    chosen = tuple(a for a in AGENTS if not args.only or a.name in args.only.split(","))
    unknown = set(filter(None, args.only.split(","))) - {a.name for a in AGENTS}
    if unknown:
        known = ", ".join(a.name for a in AGENTS)
        print(f"error: --only: no agent {', '.join(sorted(unknown))} (known: {known})")
        return 2
    if not args.table_only:
        for a in chosen:
            rows = args.out / "rows" / a.name
            if (rows / "run.json").exists():
                print(f"{a.name}: rows there, not run again", flush=True)
                continue
            run_one(a, args, args.work, rows)
    text = "\n".join(table(AGENTS, args.out)) + "\n"
    (args.out / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
