"""The example data set's suite: the built-in suite's first episode under a name of its own."""

from __future__ import annotations

from eu_audit.suites import SUITES, load_suite


@SUITES.register("example-one")
def example_one() -> list:
    first = load_suite("builtin")[0]
    return [first.model_copy(update={"id": "example-one-000", "suite": "example-one"})]
