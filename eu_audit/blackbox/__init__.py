"""The black-box side: gating an agent eu-audit did not build.

- ``contract`` / ``adapter``: the agent-under-test contract (JSON over HTTP, and a Python protocol);
- ``serve``: the OpenAI-compatible model server the agent talks to (logs every prompt, pins decoding);
- ``drive``: ``record --agent``, the factual stream, the agent's own forget, the B5 reference tenant;
- ``residue``: what the serve log and the agent's store dump still hold of the target;
- ``reference``: eu-audit's own runtime served as an agent (the passing control, forget = B7, and the
  failing one, forget = B1).
"""
