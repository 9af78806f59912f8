"""``eu-audit schema``: the JSON Schemas of eu-audit's files and contracts."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from eu_audit.cli.app import (
    Force,
    app,
    out,
    say,
)


@app.command()
def schema(
    kind: Annotated[
        str,
        typer.Argument(
            help="trace (a bundle line), episode (a suite line), audit (the --json report), agent-api "
            "(the contract an agent under test serves) or serve-log (a line of serve's request log)."
        ),
    ] = "trace",
    out_path: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write the schema here instead of stdout.")
    ] = None,
    force: Force = False,
) -> None:
    """Print a JSON Schema: a trace-bundle line (eu-audit/trace@2), an episode (eu-audit/episode@1), the
    audit report (eu-audit/audit@1), the contract an agent under test serves (agent-api) or a line of
    serve's request log (serve-log)."""
    from eu_audit.bundle.records import json_schema
    from eu_audit.jsonl import atomic_writer, check_output_path

    if out_path is not None:
        check_output_path(out_path, force=force)
    if kind == "trace":
        doc = json_schema()
    elif kind == "episode":
        from eu_audit.episodes import Episode

        doc = {"$id": "eu-audit/episode@1", **Episode.model_json_schema()}
    elif kind == "audit":
        from eu_audit.audits.model import AuditReport

        doc = {"$id": "eu-audit/audit@1", **AuditReport.model_json_schema()}
    elif kind == "agent-api":
        from eu_audit.blackbox.contract import agent_api_schema as agent_api

        doc = agent_api()
    elif kind == "serve-log":
        from eu_audit.serve.api import LogEntry

        doc = {"$id": "eu-audit/serve-log@1", **LogEntry.model_json_schema()}
    else:
        raise typer.BadParameter(f"unknown schema '{kind}' (trace, episode, audit, agent-api, serve-log)")
    text = json.dumps(doc, indent=2)
    if out_path is None:
        sys.stdout.write(text + "\n")
    else:
        with atomic_writer(out_path, private=False) as f:
            f.write(text + "\n")
        say(out, f"wrote {out_path}")


# audit's options, one alias each (the command's signature stays readable)
