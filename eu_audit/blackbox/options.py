"""What ``eu-audit gate`` is told: the options of one black-box run, and the tenants of a session."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from eu_audit.audits.model import OWN_FLOOR
from eu_audit.blackbox.adapter import Bounds
from eu_audit.defaults import SAMPLE_TEMPERATURE, SAMPLES_K
from eu_audit.runtime.world import World
from eu_audit.shards import SessionSlice, Shard
from eu_audit.trace.records import AGENT_METHOD

#: the tenants of one session: the agent (its forget), the reference B5 (never fed z), and the positive
#: control B0 (driven like the agent, never sent the forget: what each channel holds without a forget)
RECORDED_METHODS: tuple[tuple[str, World], ...] = ((AGENT_METHOD, "factual"), ("b5", "counterfactual"))
CONTROL_TENANT: tuple[str, World] = ("b0", "factual")
#: eu-audit's own floor: its runtime (no forget) over the episode without z on the served model, as the
#: white-box B5; the reference tenant is held to it (``eu_audit.audits.own_floor``)
OWN_FLOOR_TENANT: tuple[str, World] = (OWN_FLOOR, "counterfactual")
ProbeKind = Literal["probe", "sample", "choice"]


@dataclass
class AgentRecordOptions:
    agent: str  # http://host:port or module:factory
    out: Path = Path("trace.jsonl")
    suite: str = "builtin"
    n: int | None = None
    seed: int = 0
    serve: str | None = None  # the eu-audit serve the agent's model calls go through
    k: int = SAMPLES_K  # samples of the task probe (and choices) per state
    temperature: float = SAMPLE_TEMPERATURE
    max_tool_rounds: int = 3  # tool call -> result -> reply rounds per message
    state_dir: Path | None = None  # the outbox (default: <out>.state/)
    force: bool = False
    serve_control: Path | None = None  # where serve wrote its control secret (None: its default place)
    keep_state: bool = False  # keep the state folder of a failed run
    hint: bool = False  # send the sanitized text with the forget (the reference's input: see _hint)
    shard: Shard | None = None  # drive only this shard's sessions (ids stay run-wide)
    sessions: SessionSlice | None = None  # drive only each suite's sessions FROM to TO - 1 (--sessions)
    #: drive only the sessions with these run-wide indices (one round of ``rounds.record_until_decided``)
    only: frozenset[int] | None = None
    bounds: Bounds = field(default_factory=Bounds)
    concurrency: int = 1  # tenants driven at the same time, each on its own lane of serve
    #: events after the forget, each followed by the checks again (``recheck.parse_rechecks``)
    recheck: tuple[str, ...] = ()
    #: drive a third tenant per session like the agent's but never send it the forget (``CONTROL_TENANT``):
    #: every rule's and channel's positive control; about half again the run's time
    positive_control: bool = True
    #: drive a fourth tenant per session, eu-audit's own runtime over the episode without z on serve's
    #: model (``OWN_FLOOR_TENANT``), and hold the agent's reference to it; needs ``serve``
    own_floor: bool = True
    #: files or globs the agent persists tenants in (``{tenant}`` is each tenant's name), for an agent that
    #: does not name them itself (``files`` in the contract): eu-audit reads them (``forensics``)
    store_paths: tuple[str, ...] = ()
