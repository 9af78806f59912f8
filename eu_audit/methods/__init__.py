"""Forget methods B0..B9, B5' and span-only excision, in one registry (``METHODS``).

The built-in methods live in ``baselines``, ``selective`` and ``excision``; the registry imports them on
first use. Register your own with ``@method("name", "description")`` on ``fn(ctx) -> MethodResult``.
"""

from eu_audit.methods.base import METHODS, ForgetContext, MethodResult, MethodSpec, apply_method, method

#: The paper's order; ``all`` means these.
ORDER = ["b0", "b1", "b2", "b3", "b4", "b5", "b5p", "b6", "b7", "b8", "b9", "excise"]

__all__ = ["METHODS", "ORDER", "ForgetContext", "MethodResult", "MethodSpec", "apply_method", "method"]
