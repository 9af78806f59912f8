"""Seconds per test file from a pytest JUnit XML (``pytest --junitxml junit.xml``), written to
``tests/file_costs.json``: the order in which ``tests/conftest.py`` hands files to the test workers
(longest first), so a run's last file is a short one.

    .venv/bin/python -m pytest --junitxml /tmp/junit.xml && python tools/test_costs.py /tmp/junit.xml
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def file_costs(junit: Path) -> dict[str, float]:
    """Each test file's summed test time (setup, call and teardown, as JUnit's ``time``), rounded."""
    per_file: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        name = next((f"{part}.py" for part in module if part.startswith("test_")), None)
        if name:
            per_file[name] += float(case.get("time", "0") or 0)
    return {k: round(v, 1) for k, v in sorted(per_file.items(), key=lambda kv: -kv[1])}


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    costs = file_costs(Path(sys.argv[1]))
    out = ROOT / "tests" / "file_costs.json"
    out.write_text(json.dumps(costs, indent=1) + "\n")
    print(f"wrote {out}: {len(costs)} files, {sum(costs.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
