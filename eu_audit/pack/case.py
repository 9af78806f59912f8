"""A residue-pack case: one deletion bug a stack's users reported, pinned to the release that has it (and
the one that fixed it, where there is one), the agent and episode that trigger it, and the verdict
eu-audit must give on each release. Cases live in a folder of their own, one ``case.toml`` per case
(``pack/NAME/case.toml`` in a checkout); ``eu-audit pack run`` runs them (``eu_audit.pack.run``)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from eu_audit.errors import BadInput

#: the file a case folder holds
CASE_FILE = "case.toml"


class Release(BaseModel):
    """One release of the stack and what eu-audit must say of it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9-]*$")  # "buggy", "fixed"
    #: the pins that make the release (PyPI requirements, exact versions)
    pins: list[str] = Field(default_factory=list)
    #: arguments for the agent on this release, after the case's own
    agent_args: list[str] = Field(default_factory=list)
    #: failed: the gate must fail, naming ``where``; held: every rule of the case must hold
    expect: Literal["failed", "held"]
    #: a text the failed verdict's evidence must name (a table, a file region, a vector key)
    where: str = ""

    @model_validator(mode="after")
    def _pinned(self) -> Release:
        loose = [p for p in self.pins if "==" not in p]
        if loose:
            raise ValueError(f"every pin must be exact (==): {', '.join(loose)}")
        if self.expect == "failed" and not self.where:
            raise ValueError("a release expected to fail names where (the table, file or key)")
        return self


class Case(BaseModel):
    """A reported deletion bug as a runnable, pinned check (``case.toml``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    stack: str
    bug: str  # the report: a tracker URL (issue or pull request)
    title: str  # what the bug is, in a line
    leaves: str  # what the bug leaves behind, in a line
    #: the agent that talks the contract, relative to the repository root (a reference agent)
    agent: str
    agent_args: list[str] = Field(default_factory=list)
    #: the agent's other requirements, pinned, installed beside each release's pins
    requirements: list[str] = Field(default_factory=list)
    #: the Python that makes the case's venvs ("" the one running eu-audit); e.g. Debian's, whose sqlite3
    #: can load extensions (sqlite-vec)
    python: str = ""
    #: a registered suite, or an episodes file in the case's folder (an episode the bug needs, e.g. z
    #: within the last messages a library keeps)
    suite: str = "builtin"
    n: int = Field(1, ge=1, le=30)
    #: events after the forget, each followed by the checks again (``eu-audit gate --recheck``): e.g.
    #: ``at-once``, the dump right after the forget, for a copy that later messages evict
    recheck: list[str] = Field(default_factory=list)
    model: str = "smollm2-135m"
    #: the rules the verdict is read from (the bug's channel: ``agent.disk.orphans==0``)
    gate: list[str] = Field(min_length=1)
    releases: list[Release] = Field(min_length=1)
    #: where no release fixed it yet, say so (the table shows it)
    fixed: str = ""
    #: false: the agent runs in eu-audit's own interpreter, no venv and no pins (an agent whose libraries
    #: eu-audit already has, as the tests' own)
    venv: bool = True
    #: a reported bug this pack could not reproduce here, and why (what it needs that a run cannot have);
    #: the table lists it with the reason, ``pack run`` skips it, and recall never counts it
    not_reproduced: str = ""
    #: a case marked not reproduced after it ran: release name -> the verdict it got then, so recall and
    #: false alarms still count the run (an exclusion stays in the table with its evidence)
    measured: dict[str, Literal["held", "failed", "inconclusive", "insensitive"]] = Field(
        default_factory=dict
    )

    #: the case's folder (set when it is loaded from its case.toml)
    _folder: Path | None = PrivateAttr(default=None)

    @property
    def runnable(self) -> bool:
        return not self.not_reproduced

    def suite_ref(self) -> str:
        """What record reads: the episodes file in the case's folder where the case names one, else the
        registered suite."""
        if self._folder is not None and (self._folder / self.suite).is_file():
            return str(self._folder / self.suite)
        return self.suite

    @model_validator(mode="after")
    def _releases(self) -> Case:
        from eu_audit.tiers import recheck_problem

        for name in self.recheck:
            if recheck_problem(name):
                raise ValueError(f"recheck {name!r}: {recheck_problem(name)}")
        names = [r.name for r in self.releases]
        if len(set(names)) != len(names):
            raise ValueError(f"release names repeat: {names}")
        for r in self.releases:
            if self.venv and not r.pins:
                raise ValueError(f"release {r.name!r} pins nothing: a release is its pins (or venv = false)")
            if not self.venv and r.pins:
                raise ValueError(f"release {r.name!r} pins packages, but the case runs without a venv")
        return self


def load_case(path: Path) -> Case:
    """A case from its ``case.toml``, refused with exit 2 naming the file and field when it is not one."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise BadInput(f"cannot read: {exc.strerror}", path=str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"not valid TOML: {exc}", path=str(path)) from None
    try:
        case = Case.model_validate(data)
    except ValidationError as exc:
        from eu_audit.jsonl import describe_validation_error

        fld, msg = describe_validation_error(exc)
        raise BadInput(f"not a pack case ({msg})", path=str(path), field=fld) from None
    if case.name != path.parent.name:
        raise BadInput(f"name {case.name!r} differs from its folder's", path=str(path), field="name")
    case._folder = path.parent
    return case


def load_cases(folder: Path, names: list[str] | None = None) -> list[Case]:
    """Every case under ``folder`` (or the named ones), in name order; an unknown name is bad input."""
    if not folder.is_dir():
        raise BadInput("no such folder of pack cases", path=str(folder))
    cases = [load_case(p) for p in sorted(folder.glob(f"*/{CASE_FILE}"))]
    if not cases:
        raise BadInput(f"holds no case (*/{CASE_FILE})", path=str(folder))
    if names:
        known = {c.name: c for c in cases}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise BadInput(f"no such case: {', '.join(unknown)} (known: {', '.join(known)})")
        cases = [known[n] for n in names]
    return cases
