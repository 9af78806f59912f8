"""The SQLite agent of ``tests/sqlite_agent.py`` as a server of its own (``--port``, ``--data``, ``--mode``),
the way the residue pack starts a case's agent: for the pack runner's mechanics test, not a real stack."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--mode", required=True, choices=["plain", "secure", "cascade", "overdelete", "hiding"])
    args = ap.parse_args()
    os.environ["SQLITE_AGENT_ROOT"] = str(args.data)
    os.environ.setdefault("EU_AUDIT_TEST_SERVE", os.environ["OPENAI_BASE_URL"].removesuffix("/v1"))
    from eu_audit.blackbox.agent_server import run_agent_server
    from tests import sqlite_agent

    run_agent_server(getattr(sqlite_agent, args.mode)(), port=args.port)


if __name__ == "__main__":
    main()
