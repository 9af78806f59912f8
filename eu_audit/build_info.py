"""Which eu-audit made a file: its version and, in a git checkout, its commit. Every report's footer
names both, so a figure can be traced to the code that computed it."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

from eu_audit import __version__


@functools.cache
def source_commit() -> str:
    """The commit this code runs from (``-dirty`` when tracked files differ from it), or ``release X`` when
    eu-audit is installed from a package rather than run from a checkout."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return f"release {__version__}"
    git = ["git", "-C", str(root)]
    try:
        head = subprocess.run(
            [*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    sha = head.stdout.strip()
    return (sha + ("-dirty" if dirty.stdout.strip() else "")) if sha else "unknown"


def command_line() -> str:
    """The command this process runs, as a user would type it."""
    return " ".join(["eu-audit", *sys.argv[1:]])
