"""ToolSandbox (Apple, github.com/apple/ToolSandbox): what a loader needs.

ToolSandbox's scenarios are Python objects built by its own package (``tool_sandbox``), which is not on
PyPI and cannot be installed on machines that reach only package registries. With it installed,
``--suite toolsandbox:all`` would enumerate its named scenarios. Until then the loader says so instead
of pretending: install ToolSandbox from its repository (``pip install -e ToolSandbox``) first.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from eu_audit.episodes import Episode
from eu_audit.errors import BadInput
from eu_audit.suites import LOADERS


def load_toolsandbox(path: Path) -> list[Episode]:
    if importlib.util.find_spec("tool_sandbox") is None:
        raise BadInput(
            "the ToolSandbox loader needs Apple's 'tool_sandbox' package, which is not published on PyPI: "
            "clone github.com/apple/ToolSandbox and 'pip install -e' it, then use --suite toolsandbox:all"
        )
    raise BadInput(  # pragma: no cover - needs the package, unavailable here
        "tool_sandbox is installed, but its scenario adaptor is not written yet (no way to test it here)"
    )


LOADERS.add("toolsandbox", load_toolsandbox)
