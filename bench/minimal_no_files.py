"""The minimal example agent with its ``files`` capability taken away, for ``forensics_cost.py``: the same
agent, code and model calls, except that eu-audit is not told where it persists, so the forensics do not
run. Not an agent to copy (that is ``examples/agents/minimal/agent.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

AGENTS = Path(__file__).resolve().parent.parent / "examples" / "agents"
sys.path.insert(0, str(AGENTS / "minimal"))
sys.path.insert(0, str(AGENTS))

from agent import MinimalAgent  # noqa: E402
from contract_kit import arguments, serve_agent  # noqa: E402


class WithoutFiles(MinimalAgent):
    files = None  # the kit serves (and declares) only the methods an agent defines


if __name__ == "__main__":
    args = arguments(__doc__, 9011, "minimal-agent-data", "a folder per tenant").parse_args()
    agent = WithoutFiles(args.data, args.model)
    serve_agent(agent, "minimal-agent-no-files", args.port, tenant_model_url=True)
