"""The facts a black-box run records in its bundle header (``engine_facts``), typed: what was driven,
through which serve, under which control key, with which hint and how many samples. A white-box bundle's
header says which engine computed its states; a black-box one says this instead."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from eu_audit.blackbox.contract import API_VERSION, Capabilities
from eu_audit.defaults import SAMPLE_TEMPERATURE, SAMPLES_K
from eu_audit.errors import BadInput


class StoppedFacts(BaseModel):
    """Where a run in rounds (``eu-audit gate``) stopped and why
    (``eu_audit.audits.stopping``)."""

    model_config = ConfigDict(extra="forbid")

    n: int = Field(ge=1)  # sessions per suite recorded
    max_n: int = Field(ge=1)
    why: str
    early: bool  # before max_n, on a failure more sessions cannot undo
    rounds: list[int] = Field(default_factory=list)  # n per suite after each round
    serve_logs: list[str] = Field(default_factory=list)  # each round's serve-log digest, in order

    def sentence(self) -> str:
        from eu_audit.audits.stopping import Stop

        return Stop(self.n, self.max_n, self.why, self.early).sentence()


class AgentRunFacts(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: str = ""  # --agent as given (a URL or module:factory)
    capabilities: Capabilities = Field(default_factory=Capabilities)
    contract: str = API_VERSION
    serve: str | None = None  # the eu-audit serve the agent's model calls went through
    serve_info: dict[str, Any] = Field(default_factory=dict)
    serve_log_digest: str = ""
    serve_control_key: str = ""  # the key whose marks say which requests were post-forget
    forget_hint: str = ""  # what the forget request carried (source text; its sanitized text with --hint)
    shard: str | None = None
    sessions: str | None = None  # --sessions FROM:TO: the slice of each suite's sessions this run drove
    k: int = Field(SAMPLES_K, ge=1)  # samples of the task probe per state
    temperature: float = Field(SAMPLE_TEMPERATURE, ge=0.0)
    concurrency: int = Field(1, ge=1)  # tenants driven at the same time (each on its own lane)
    merged_from: list[str] = Field(default_factory=list)  # the shard bundles ``eu-audit merge`` joined
    stopped: StoppedFacts | None = None  # a run in rounds: where it stopped, and why
    #: a run stopped by ^C or SIGTERM that kept the sessions it had finished: when ("after 1 of 2 session(s)")
    interrupted: str | None = None

    @classmethod
    def of(cls, engine_facts: dict[str, Any], where: str = "") -> AgentRunFacts:
        """The facts of a black-box bundle's header, refused (exit 2) when they are not these."""
        try:
            return cls.model_validate(engine_facts)
        except ValidationError as exc:
            from eu_audit.jsonl import describe_validation_error

            fld, msg = describe_validation_error(exc)
            raise BadInput(f"a black-box run's header facts: {msg}", path=where or None, field=fld) from None

    def engine_facts(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)
