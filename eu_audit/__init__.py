"""eu-audit: prove whether an LLM agent really forgets.

Layout mirrors the paper and the product (``docs/paper-to-code.md`` maps each object to its module):

- white box: ``engines`` (KV engines), ``runtime`` (the agent, blocks, tools, memory), ``trace`` and
  ``bundle`` (the trace format), ``checkpoints``, ``record``, ``methods`` (B0-B9, B7 the paper's
  selective replay), ``unlearn``, ``replay``;
- measurement: ``audits`` (probes, samples, the behavioral test, gates and verdicts), ``stats``,
  ``matching`` (what counts as z), ``rounds`` (a run recorded until decided);
- black box: ``blackbox`` (the agent contract, the harness, residue, tamper, forensics), ``serve`` (the
  model the agent talks to, logged and pinned);
- data and extension: ``datasets``, ``suites``, ``episodes``, ``pack`` (the residue pack), ``registry``
  and ``plugins`` (the one list of extension points);
- output: ``view`` (HTML), and the thin ``cli``.
"""

__version__ = "0.1.0"
