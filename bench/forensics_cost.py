"""What eu-audit's own read of an agent's files costs a black-box session: ``record --agent`` wall time
with the forensics on and off, side by side in one run, alternating, on one serve.

``--agent sqlite`` (default) is the SQLite agent of the tests (``tests/sqlite_agent.py``: history,
memories and their vectors in one WAL database per tenant, ``secure_delete`` and a checkpoint on forget,
no chat call); with the forensics off it does not name its files (``SQLITE_AGENT_NO_FILES=1``).
``--agent minimal`` is the minimal example agent (``examples/agents/minimal``: a model call every turn,
its state in JSON files), served twice, once without its ``files`` capability (``minimal_no_files.py``):
a session of a real agent, whose turns are model calls. The control agent (``eu-audit agent``) persists
nothing, so the forensics cost it nothing.

    python bench/forensics_cost.py --model smollm2-135m --n 4 --repeats 3
    python bench/forensics_cost.py --agent minimal --model smollm2-135m --n 2 --k 1 --repeats 2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import cli_server, http_process  # noqa: E402

MINIMAL = ROOT / "examples" / "agents" / "minimal" / "agent.py"
WITHOUT_FILES = ROOT / "bench" / "minimal_no_files.py"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=4, help="sessions of the builtin suite")
    ap.add_argument("--k", type=int, default=5, help="samples per state, as the gate runs them")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--agent", choices=["sqlite", "minimal"], default="sqlite")
    args = ap.parse_args()

    from eu_audit.blackbox.drive import AgentRecordOptions, record_agent

    times: dict[str, list[float]] = {"on": [], "off": []}
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        url = stack.enter_context(cli_server("serve", "--model", args.model))
        os.environ["EU_AUDIT_TEST_SERVE"] = url
        agents = {"on": "tests.sqlite_agent:secure", "off": "tests.sqlite_agent:secure"}
        if args.agent == "minimal":
            env = {"OPENAI_BASE_URL": url + "/v1"}
            for mode, script in (("on", MINIMAL), ("off", WITHOUT_FILES)):
                argv = [sys.executable, str(script), "--data", str(Path(tmp) / f"agent-{mode}")]
                agents[mode] = stack.enter_context(http_process(argv, "/eu-audit/v1/capabilities", env))
        for i in range(args.repeats):
            for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
                if mode == "off":
                    os.environ["SQLITE_AGENT_NO_FILES"] = "1"
                else:
                    os.environ.pop("SQLITE_AGENT_NO_FILES", None)
                out = Path(tmp) / f"{mode}-{i}.jsonl"
                opts = AgentRecordOptions(
                    agent=agents[mode], serve=url, suite="builtin", n=args.n, k=args.k, out=out
                )
                t0 = time.perf_counter()
                record_agent(opts)
                times[mode].append(time.perf_counter() - t0)
                print(f"run {i} forensics {mode}: {times[mode][-1]:.1f} s", flush=True)
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    print(f"median record --agent wall time, agent {args.agent}, {args.n} session(s), model {args.model}:")
    print(f"  forensics on  {on:.1f} s")
    print(f"  forensics off {off:.1f} s")
    print(f"  ratio on/off  {on / off:.3f}  (+{100 * (on / off - 1):.1f}%)")


if __name__ == "__main__":
    main()
