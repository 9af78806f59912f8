"""What an audit is asked to measure and how (``AuditOptions``), below the audit's orchestrator
(``eu_audit.audit``) so the modules it calls can name the type without importing it back."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from eu_audit.defaults import ALPHA, ANSWER_MAX_TOKENS, MARGIN, SAMPLE_TEMPERATURE, SAMPLES_K


@dataclass
class AuditOptions:
    methods: Sequence[str] = ("all",)
    floor: bool = True
    k: int = SAMPLES_K
    temperature: float = SAMPLE_TEMPERATURE
    max_tokens: int = ANSWER_MAX_TOKENS
    margin: float = MARGIN
    alpha: float = ALPHA  # the gates' one-sided significance level
    seed: int = 0
    unlearned_out: Path | None = None
    serving: bool = False  # also measure serving-layer residue (a served engine's prefix cache)
    server: str | None = None  # a served bundle's server, overriding the one its header records
    command: str = ""  # the CLI command that ran it (recorded in the report, never in its results)

    def fingerprint(self) -> str:
        """What a state's results depend on besides the state: resumed results must match it."""
        keys = ("k", "temperature", "max_tokens", "seed")
        d = {k: v for k, v in asdict(self).items() if k in keys}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]
