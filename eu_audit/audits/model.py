"""The audit's data model (the ``--json`` report, schema ``eu-audit schema audit``): per-state results,
per method x suite cells against the floor, gate results. Read by the tables, JUnit, gates and the
Markdown report; written by the orchestrator (``eu_audit.audit``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    computed_field,
    field_validator,
    model_serializer,
    model_validator,
)

from eu_audit import __version__
from eu_audit.defaults import ALPHA
from eu_audit.tiers import tier_ids
from eu_audit.trace.records import Side, side_of

#: the method whose state is the measured false-positive floor: the agent that never saw z
FLOOR = "b5"
#: the pseudo-method whose cells hold the serving-layer residue items (``serving.residual_cached_tokens``)
SERVING = "serving"
#: a black-box run's floor as eu-audit measures it: eu-audit's own runtime driven over the episode without
#: z on the served model (the white-box B5), beside the agent's reference (``eu_audit.audits.own_floor``)
OWN_FLOOR = "own-floor"


class ProbeOutcome(BaseModel):
    probe: str
    text: str
    leaked: bool


class _SetFieldsOnly(BaseModel):
    """A record whose JSON holds only the fields that were set, as the dict it replaced did: the audit
    JSONs written before it was typed read back, and are written again, unchanged. False when nothing
    was set (a white-box state has no residue)."""

    model_config = ConfigDict(extra="forbid")

    @model_serializer(mode="wrap")
    def _set_fields(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if k in self.model_fields_set}

    def __bool__(self) -> bool:
        return bool(self.model_fields_set)


class RecheckOutcome(_SetFieldsOnly):
    """What one recheck (``eu-audit gate --recheck EVENT``, the channel ``after.EVENT``) found: items
    holding z in the event's prompts, answers and dump (None: not observed), out of how many, whether z
    *came back* (held after the event, in nothing right after the forget), one quoted place; or only why
    it did not run."""

    skipped: str = ""
    prompts: int | None = None
    answers: int | None = None
    store: int | None = None
    of: dict[str, int | None] = Field(default_factory=dict)
    held: int = 0
    back: bool = False
    said: bool = False
    example: str = ""


class BystanderOutcome(_SetFieldsOnly):
    """The bystander tenant's memories (``eu_audit.blackbox.bystander``) and how many the forget lost."""

    records: int | None = None
    lost: int = 0
    example: str = ""


class StateResidue(_SetFieldsOnly):
    """Where a black-box state still held z after the forget, seen from outside: per tier counts and one
    quoted place for the prompts (serve's log), the store dump and the files eu-audit read, the stores the
    dump had, the bystander's memories, and each recheck's outcome."""

    context_tiers: dict[str, int] = Field(default_factory=dict)
    context_example: str = ""
    store_tiers: dict[str, int] = Field(default_factory=dict)
    store_example: str = ""
    #: every store the dump held, name -> items ({}: an empty dump; None: no dump, names unknown)
    stores: dict[str, int] | None = None
    bystander: BystanderOutcome | None = None
    disk_tiers: dict[str, int] = Field(default_factory=dict)
    disk_example: str = ""
    disk_examples: dict[str, str] = Field(default_factory=dict)  # one place per disk channel
    disk_unread: dict[str, str] = Field(default_factory=dict)  # file -> why it was not measured
    disk_undeclared: list[str] = Field(default_factory=list)  # files read the agent did not name
    after: dict[str, RecheckOutcome] = Field(default_factory=dict)  # event -> outcome, in run order
    control_key: str = ""  # the key that marked the requests counted as post-forget

    #: an audit written before the prompt tiers had ids keyed them by their labels: read as ids
    _tier_ids = field_validator("context_tiers", mode="before")(tier_ids)

    def counts(self, field: str) -> dict[str, Any]:
        """The per-tier counts a channel kind keeps in ``field`` (``ChannelKind.counts``)."""
        got: dict[str, Any] = getattr(self, field)
        return got


class StateAudit(BaseModel):
    """One post-forget state: a recorded session under one method."""

    model_config = ConfigDict(extra="forbid")

    session_id: str
    episode_id: str
    suite: str
    method: str
    error: str | None = None
    probes: list[ProbeOutcome] = Field(default_factory=list)
    samples: list[str] = Field(default_factory=list)  # k task-probe samples at the audit temperature
    sample_seeds: list[int] = Field(default_factory=list)
    choices: list[str | None] = Field(default_factory=list)  # preference suite: the option each sample picked
    values: dict[str, float | None] = Field(default_factory=dict)  # metric -> value (booleans as 0/1)
    #: metric -> why it could not be measured on this state (e.g. "agent lacks fork")
    unmeasured: dict[str, str] = Field(default_factory=dict)
    action_sinks: dict[str, int] = Field(default_factory=dict)  # sink class -> calls carrying z
    #: B5 only: k more samples under other seeds (B5 against itself: the sampling floor)
    floor_samples: list[str] = Field(default_factory=list)
    sample_ids: list[list[int]] = Field(default_factory=list)  # generated ids of ``samples``
    #: a black-box state: where the target still was (tier -> count) and one quoted example per side
    residue: StateResidue = Field(default_factory=StateResidue)
    #: a black-box state: one quoted place where the agent said z after the forget (its reply to a turn of
    #: the episode, a summary it wrote), for the channel row "replies after the forget"
    reply_example: str = ""
    #: a black-box state: how many of the agent's replies and summaries after the forget said anything
    #: (None: audited before this was counted); 0 makes that channel *unknown*, not erased
    replies: int | None = None
    floor_sample_ids: list[list[int]] = Field(default_factory=list)
    #: seconds this state's audit took (kept across a resume, so a resumed report still costs it)
    audit_s: float | None = None
    #: its answers are those of an earlier state of the audit that is the same token for token, memory
    #: and questions included (``eu_audit.audit.answers_key``): not asked again
    answers_reused: bool | None = None
    #: sha256 of the state itself (the cache's token ids and the memory store): equal digests are the
    #: same state, which on an exact engine decides a floor rule by equality (``eu_audit.audits.verdict``)
    state_digest: str | None = None
    #: a black-box agent's forget: did the dump right after it differ from the one right before (False: a
    #: no-op; None: no dump, or not its own forget)
    forget_changed: bool | None = None


class Cell(BaseModel):
    """One method on one suite (or on all suites pooled: suite "all")."""

    method: str
    suite: str
    n: int
    errors: int
    values: dict[str, float | None]
    floor: dict[str, float | None]
    p: dict[str, float | None]  # McNemar (binary) / Wilcoxon (continuous) vs the floor
    tost: dict[str, float | None]  # TOST equivalence to the floor within +-margin
    unmeasured: dict[str, str] = Field(default_factory=dict)  # metric -> reason, when no state measured it


#: insensitive: the rule's positive control (B0, the state without the forget) never showed what the rule
#: looks for, so this measurement cannot tell a forget from none; it never counts as a hold
Outcome = Literal["held", "failed", "inconclusive", "insensitive"]


class GateResult(BaseModel):
    """One rule's verdict (``eu_audit.audits.verdict``): what the summary, JSON, JUnit and exit code all
    read."""

    rule: str
    outcome: Outcome
    detail: str
    test: str = ""  # what decided it: a fact, equality, a bound, a test
    n: int = 0  # sessions behind it
    p: float | None = None  # one-sided p that the method is worse than the reference
    interval: tuple[float | None, float | None] | None = None  # bound(s) of the mean worse-difference
    n_needed: int | None = None  # inconclusive: the n that would decide at the observed rates
    #: what the positive control showed on the rule's sessions ("B0 leaked in 7 of 30 sessions (0.23)",
    #: "not recorded"); empty where the rule needs none (cost, utility, equality on an exact engine)
    control: str = ""
    #: the control's rate: the share of its sessions where it showed what the rule looks for
    control_rate: float | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def held(self) -> bool:
        return self.outcome == "held"

    @model_validator(mode="before")
    @classmethod
    def _from_two_outcomes(cls, data: Any) -> Any:
        """A report written before verdicts had three outcomes said only held or not."""
        if isinstance(data, dict) and "outcome" not in data and "held" in data:
            data = {**data, "outcome": "held" if data["held"] else "failed"}
        return data


class Tampering(BaseModel):
    """One kind of tamper attempt by a black-box agent, on one tenant of one session
    (``eu_audit.blackbox.tamper``)."""

    session_id: str
    tenant: str  # the method: agent, b5 (the reference), b0 (the positive control)
    kind: str
    count: int
    example: str = ""


class OwnFloorCheck(BaseModel):
    """The agent's reference (B5: the agent fed the episode without z) against eu-audit's own floor on the
    same sessions, one suite and one place z can be said (``eu_audit.audits.own_floor``)."""

    suite: str
    said: str  # "probes" | "samples"
    n: int  # sessions with both
    reference: int  # sessions the reference said z there
    own_floor: int  # sessions eu-audit's floor said z there
    reference_only: int  # sessions only the reference said it
    own_floor_only: int
    p: float  # one-sided, valid at any n a run stops at (``verdict.betting_p``)
    above: bool  # the reference says z more often than the floor: p < alpha


class AuditReport(BaseModel):
    format: Literal["eu-audit/audit@1"] = "eu-audit/audit@1"
    tool_version: str = __version__
    tool_commit: str = ""  # the eu-audit commit that computed it (build_info.source_commit)
    command: str = ""  # the command that made it
    #: the eu-audit commit whose matcher re-scored the texts from these rows (``eu-audit rescore``); empty
    #: when they are scored as audited. Shards scored by different matchers never merge
    rescored_by: str = ""
    bundle: str
    bundle_digest: str
    unlearned: str | None = None
    model: str
    model_digest: str | None = None  # sha256 of the weights the bundle was recorded with
    engine: str = "hf"

    @property
    def side(self) -> Side:
        """Which side made the audited run: a deployed agent's (black) or states rebuilt white-box."""
        return side_of(self.engine)

    engine_facts: dict[str, Any] = Field(default_factory=dict)  # library and version, threads, KV type
    seed: int
    k: int
    temperature: float
    margin: float
    alpha: float = ALPHA  # the gates' significance level (one-sided)
    floor: bool = True  # measured against the B5 floor; without it, floor comparisons are not measured
    methods: list[str]
    suites: list[str]
    probes: list[str]
    #: suite -> each probe that leaked on the floor (B5) with its session ("direct in s3"): dropped there only
    probes_dropped: dict[str, list[str]]
    floor_self: dict[str, dict[str, float | None]]  # suite -> B5 vs B5 (other seeds): the sampling floor
    states: list[StateAudit]
    cells: list[Cell]
    gates: list[GateResult] = Field(default_factory=list)
    errors: int = 0
    #: a black-box agent's tamper attempts (any one fails the gate: ``gate.TAMPER_RULE``)
    tampering: list[Tampering] = Field(default_factory=list)
    #: a black-box run's reference against eu-audit's own floor (a reference above it fails the gate:
    #: ``gate.OWN_FLOOR_RULE``); empty where the run measured no floor of eu-audit's own
    own_floor: list[OwnFloorCheck] = Field(default_factory=list)
    #: the plug-ins loaded when it was made ("my-plugin==0.1.0 (eu_audit.plugins: mine)"), and each
    #: registry entry not built into eu-audit with what defined it ("metrics:mine" -> "my-plugin==0.1.0")
    plugins: list[str] = Field(default_factory=list)
    defined_by: dict[str, str] = Field(default_factory=dict)
    cost: dict[str, float | int | str] = Field(default_factory=dict)  # wall time, engine, cores, per session

    def cell(self, method: str, suite: str) -> Cell | None:
        return next((c for c in self.cells if c.method == method and c.suite == suite), None)


def read_report(path: Path) -> AuditReport:
    """An audit's ``--json`` report, refused with exit 2 naming the file when it is not one."""
    from eu_audit.errors import BadInput

    try:
        return AuditReport.model_validate_json(Path(path).read_bytes())
    except OSError as exc:
        raise BadInput(f"cannot read: {exc.strerror}", path=str(path)) from None
    except ValidationError as exc:
        from eu_audit.jsonl import describe_validation_error

        fld, msg = describe_validation_error(exc)
        raise BadInput(f"not an eu-audit audit report ({msg})", path=str(path), field=fld) from None
    except ValueError as exc:
        raise BadInput(f"not an eu-audit audit report ({str(exc).splitlines()[0]})", path=str(path)) from None
