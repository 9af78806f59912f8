"""Forget methods B0..B9, B5' and span-only excision, in one registry (``METHODS``)."""

from eu_audit.methods import baselines, excision, selective  # noqa: F401  (they register themselves)
from eu_audit.methods.base import DESCRIPTIONS, METHODS, ForgetContext, MethodResult, method

#: The paper's order; ``all`` means these.
ORDER = ["b0", "b1", "b2", "b3", "b4", "b5", "b5p", "b6", "b7", "b8", "b9", "excise"]

__all__ = ["DESCRIPTIONS", "METHODS", "ORDER", "ForgetContext", "MethodResult", "method"]
