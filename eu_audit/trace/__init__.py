"""The domain state of a recording: blocks (``blocks``), the provenance graph over them (``provenance``:
the paper's ArtifactGraph, LocateSource, FirstEntry, TaintClosure), records (``records``), sessions and
bundles (``session``), and rebuilding a state in an engine (``state``).

``eu_audit.bundle`` is only the file format (read and write); everything that reasons about a session
works on the objects here. This package imports nothing itself, so importing ``eu_audit.trace.blocks``
(which the runtime does) never pulls the sessions and the engines in with it: import each name from its
module (``from eu_audit.trace.state import rebuild_state``).
"""
