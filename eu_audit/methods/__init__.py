"""Forget methods B0..B9, B5' and span-only excision, in one registry (``METHODS``).

The built-in methods live in ``baselines``, ``selective`` and ``excision``; the registry imports them on
first use. Register your own with ``@method("name", "description")`` on ``fn(ctx) -> MethodResult``; its
``place`` puts it in ``all`` and the tables (the built-ins carry the paper's order, 0..10).
"""

from eu_audit.methods.base import (
    METHODS,
    ForgetContext,
    MethodResult,
    MethodSpec,
    all_methods,
    apply_method,
    method,
    method_order,
)

__all__ = [
    "METHODS",
    "ForgetContext",
    "MethodResult",
    "MethodSpec",
    "all_methods",
    "apply_method",
    "method",
    "method_order",
]
