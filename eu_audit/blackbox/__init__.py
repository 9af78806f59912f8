"""The black-box side: gating an agent eu-audit did not build. The model server the agent talks to is
its own package (``eu_audit.serve``); what measures and decides an audit is ``eu_audit.audits``.

- ``contract`` / ``adapter``: the agent-under-test contract (JSON over HTTP) and its Python form;
  ``agent_server`` serves a Python agent over it;
- ``options`` and ``facts``: what a run is told, and what it records in the bundle's header;
- ``drive`` (``eu-audit gate``): the tenants of each session (the agent that forgets, the B5 reference,
  the no-forget control), in an order the agent cannot predict; ``driver`` drives one tenant;
- ``serve_control``: the harness's hold on serve (marks, pinned decoding, the log);
- what is left after the forget: ``residue`` (the serve log and the store dump), ``forensics`` (the
  files the agent persists, read by eu-audit), ``bystander`` (what a forget must not touch),
  ``recheck`` (restart, compaction, more turns), ``tamper`` (what no honest agent does to serve);
- ``audit``: a black-box bundle's states for ``eu-audit audit``;
- ``reference``: eu-audit's own runtime served as an agent (the passing control, forget = B7, and the
  failing one, forget = B1).
"""
