"""eu-audit: prove whether an LLM agent really forgets.

Layout mirrors the paper: ``runtime`` (engine, agent, blocks, tools, memory), ``provenance`` (the
artifact graph), ``checkpoints``, ``bundle`` (the trace format), ``episodes`` / ``suites``, ``record``
and the thin ``cli``.
"""

__version__ = "0.1.0"
