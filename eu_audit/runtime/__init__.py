"""The agent runtime, the paper's transition function F: ``agent`` (one transition = one observation and
one model turn), its ``context`` as provenance sees it, ``chat`` formats, tool ``dispatch`` and the
``tools`` registries, the persistent ``memory`` and outbox, the ``world`` a run lives in (factual or
counterfactual), and ``resume`` (Restore: continue a session at a clean boundary). The runtime works on
the trace's domain records (``eu_audit.trace``), never on the file format (``eu_audit.bundle``)."""
