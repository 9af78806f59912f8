"""Black-box gate throughput on a local model: sessions per minute of ``record --agent`` at --concurrency
1, 4 and 8, side by side in one run, for the control agent (``eu-audit agent``, B7 forget) and the mem0
reference agent (examples/agents/mem0), both with their model behind one ``eu-audit serve`` on the local
model. Each level records the same sessions (builtin + bfcl-memory, ``--n`` each) into a fresh bundle;
the agent is restarted with an empty store between levels.

    python bench/gate_throughput.py --model smollm2-135m --n 4 --levels 1,4,8 --agents control,mem0

On a CPU the model is the bottleneck: serve decodes one request at a time (one cache per tenant's lane,
so tenants do not evict each other's prefixes), so concurrency can only overlap the agent's and the
harness's own work with the model's.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import http_process  # noqa: E402


def agent_argv(name: str, serve: str, data: Path) -> tuple[list[str], dict[str, str]]:
    if name == "control":
        return [sys.executable, "-m", "eu_audit.cli", "agent", "--serve", serve, "--forget", "b7"], {}
    script = ROOT / "examples" / "agents" / name / "agent.py"
    return [sys.executable, str(script), "--data", str(data)], {"OPENAI_BASE_URL": serve + "/v1"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=4, help="sessions per suite (builtin and bfcl-memory)")
    ap.add_argument("--k", type=int, default=5, help="samples per state, as the gate runs them")
    ap.add_argument("--levels", default="1,4,8")
    ap.add_argument("--agents", default="control,mem0")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="eu-audit-gate-tp-"))
    control = tmp / "serve.control"
    serve_argv = [sys.executable, "-m", "eu_audit.cli", "serve", "--model", args.model,
                  "--control-file", str(control), "--log", str(tmp / "serve.jsonl")]  # fmt: skip
    print(f"{args.model}; builtin + bfcl-memory, n {args.n} each (agent and b5 tenants), k {args.k}")
    print("| agent | --concurrency | sessions | wall s | sessions per min | vs 1 |")
    print("|---|---|---|---|---|---|")
    with http_process(serve_argv) as serve:
        for name in args.agents.split(","):
            base = None
            for level in [int(x) for x in args.levels.split(",")]:
                argv, env = agent_argv(name, serve, tmp / f"{name}-{level}-data")
                out = tmp / f"{name}-{level}.jsonl"
                with http_process(argv, "/eu-audit/v1/capabilities", env) as agent:
                    cmd = [sys.executable, "-m", "eu_audit.cli", "record", "--agent", agent,
                           "--serve", serve, "--serve-control", str(control),
                           "--suite", "builtin,bfcl-memory", "--n", str(args.n), "--k", str(args.k),
                           "--seed", "0", "--concurrency", str(level), "--out", str(out)]  # fmt: skip
                    t0 = time.perf_counter()
                    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
                    wall = time.perf_counter() - t0
                if proc.returncode != 0:
                    raise SystemExit(f"{name} at --concurrency {level} failed: {proc.stderr[-2000:]}")
                sessions = 2 * args.n  # each session is an agent tenant and a b5 tenant
                rate = 60 * sessions / wall
                base = base or rate
                print(
                    f"| {name} | {level} | {sessions} | {wall:.0f} | {rate:.2f} | {rate / base:.2f}x |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
