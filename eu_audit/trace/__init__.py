"""The domain state of a recording: blocks, records, sessions, bundles, and rebuilding a state in an
engine.

``eu_audit.bundle`` is only the file format (read and write); everything that reasons about a session
works on the objects here. The names below load on first use, so importing ``eu_audit.trace.blocks``
(which the runtime does) never pulls the sessions and the engines in with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eu_audit.trace.session import Bundle, SessionTrace
    from eu_audit.trace.state import rebuild_state

_LAZY = {"Bundle": "eu_audit.trace.session", "SessionTrace": "eu_audit.trace.session"}
_LAZY["rebuild_state"] = "eu_audit.trace.state"

__all__ = ["Bundle", "SessionTrace", "rebuild_state"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'eu_audit.trace' has no attribute {name!r}")
