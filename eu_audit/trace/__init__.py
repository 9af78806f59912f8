"""The domain state of a recording: records, sessions, bundles, and rebuilding a state in an engine.

``eu_audit.bundle`` is only the file format (read and write); everything that reasons about a session
works on the objects here.
"""

from eu_audit.trace.session import Bundle, SessionTrace
from eu_audit.trace.state import rebuild_state

__all__ = ["Bundle", "SessionTrace", "rebuild_state"]
