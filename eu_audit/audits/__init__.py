"""Auditing a forget: everything that measures a post-forget state and decides what the measurement
shows, the same for the white-box and the black-box side. The orchestrators that produce the states
(``eu_audit.audit``, ``eu_audit.blackbox.audit``) sit above this package; nothing here imports them or
the black-box harness (``tools/structure.py`` checks).

- the data model: ``model`` (the audit JSON), ``options`` (what an audit is asked to measure);
- what is measured: ``metric`` (a metric is one object), ``catalog`` (the built-in metrics), ``probes``,
  ``leakage``, ``metrics``, ``embed``, ``serving`` (a server's prefix cache), ``channels`` (a black-box
  agent's channels);
- scoring one state: ``scoring``, ``state_evidence``, ``rescore`` (stored texts scored again);
- across states: ``summary`` (cells against the floor), ``merge`` (shard audits joined);
- deciding: ``sensitivity`` (positive controls), ``verdict`` (held / failed / inconclusive /
  insensitive), ``gate`` (rules and gate sets), ``power`` (the n to decide), ``findings`` (the paper's
  findings as rules);
- showing: ``output`` (tables, words, JUnit), ``ci_formats`` (SARIF, ...), ``evidence`` (filed outputs
  and the signed receipt).
"""
