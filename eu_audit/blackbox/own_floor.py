"""eu-audit's own floor tenant: its runtime, no forget, driven over the episode without z on the model serve
runs, beside the agent's reference (``eu_audit.audits.own_floor`` holds the reference to it).

The agent under test never talks to it: it is an in-process ``blackbox.reference.ReferenceAgent`` whose
model calls go to a lane of serve of its own, marked with an opaque tenant name like every other tenant,
so its calls are logged, pinned and checked for tampering as theirs are. It names no files and holds no
state between tenants, so nothing it does can be another tenant's residue."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from eu_audit.blackbox.adapter import InProcessAgent
from eu_audit.blackbox.episode_stream import Driven
from eu_audit.blackbox.options import AgentRecordOptions
from eu_audit.blackbox.serve_control import ServeControl
from eu_audit.errors import BadInput


@dataclass(frozen=True)
class OwnFloor(Driven):
    """The floor tenant as a run drives it: its agent, its capabilities, and its options (no files to
    read: ``--store-path`` names the agent's, not eu-audit's; no rechecks: it is never sent a forget)."""

    @classmethod
    def open(cls, serve: ServeControl, info: dict[str, Any], opts: AgentRecordOptions) -> OwnFloor:
        from eu_audit.blackbox.reference import ReferenceAgent
        from eu_audit.engines import open_engine
        from eu_audit.models import MODELS

        model = str(info.get("model", ""))
        if serve.url is None or model not in MODELS.names():
            raise BadInput(
                f"eu-audit's own floor runs the model serve runs ({model or 'none listed'}), which eu-audit "
                "must know to load its tokenizer; record with --no-own-floor to leave it out (the "
                "reference's figures are then the floor unchecked)"
            )
        url = serve.url

        def build() -> ReferenceAgent:
            return ReferenceAgent(open_engine("openai", model, server=url), forget="b0")

        agent = InProcessAgent(build, opts.bounds)
        caps = agent.capabilities()
        return cls(agent, caps, dataclasses.replace(opts, store_paths=(), recheck=()))
