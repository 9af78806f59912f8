"""An agent module whose memory stack is not installed: importing it fails inside the module, as an agent
on a missing or broken stack does (tests/test_recheck.py). Never imported by the test run itself."""

from __future__ import annotations

import eu_audit_no_such_memory_stack  # type: ignore[import-not-found]  # noqa: F401


def agent() -> object:
    return object()
