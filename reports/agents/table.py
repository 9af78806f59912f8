"""Write the stacks x suites table of README.md in this folder from the committed audit rows: one word and
an n per cell, each a link to its report. Which audit backs which cell is stacks.json; every word is decided
again from the rows by this eu-audit (``eu_audit.view.matrix``).

    python reports/agents/table.py            # rewrites the table between the markers in README.md
    python reports/agents/table.py --check    # exit 1 when README.md's table is not what the rows say
"""

from __future__ import annotations

import sys
from pathlib import Path

from eu_audit.view.matrix import stack_matrix

HERE = Path(__file__).resolve().parent
START = "<!-- stacks table: made by table.py from stacks.json; do not edit -->"
END = "<!-- end of stacks table -->"


def table() -> str:
    return "\n".join([START, *stack_matrix(HERE / "stacks.json"), END])


def main() -> int:
    readme = HERE / "README.md"
    text = readme.read_text()
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    new = head + table() + tail
    if "--check" in sys.argv:
        return 0 if new == text else 1
    readme.write_text(new)
    print(f"wrote the table in {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
