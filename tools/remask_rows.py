"""Mask, in the committed audit rows under ``reports/``, every span the current target matcher finds.

A row is masked when it is written (``eu_audit.evidence.Mask``), by the matcher of its day. When the
matcher learns a new spelling ("the severe penicillin allergy" for "a severe ...", an IBAN cut off at the
answer's end), rows written before it can hold z in clear. This rewrites them in place: each state's texts
are masked with its episode's target (read from ``suites/``) under a fresh random salt (the bundles' own
salts are not committed, so the new digests name spans only within this pass); values are left as they
were scored. Run from the repository root: ``python tools/remask_rows.py``; it prints what it masked.
"""

from __future__ import annotations

import glob
import json
import secrets
from pathlib import Path

from eu_audit.blackbox.residue import strings
from eu_audit.evidence import Mask
from eu_audit.matching import TargetMatcher


def targets() -> dict[str, TargetMatcher]:
    out = {}
    for f in sorted(glob.glob("suites/*.jsonl")):
        for line in Path(f).read_text().splitlines():
            e = json.loads(line)
            out[e["id"]] = TargetMatcher.of(e["target"]["value"], e["target"].get("variants", []))
    return out


def main() -> None:
    matchers = targets()
    salt = secrets.token_bytes(16)
    total = 0
    for f in sorted(glob.glob("reports/**/*.json", recursive=True)):
        path = Path(f)
        raw = path.read_text()
        try:
            d = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(d, dict) or "states" not in d:
            continue
        changed = 0
        for state in d["states"]:
            m = matchers.get(state.get("episode_id", ""))
            if m is None:
                continue
            masked = Mask((m,), salt).value(state)
            pairs = [
                (a, b) for a, b in zip(strings(state), strings(masked), strict=True) if a != b
            ]  # keys never differ
            for before, after in pairs:  # in the text as written: every other byte stays as it was
                old_json, new_json = (
                    json.dumps(before, ensure_ascii=False),
                    json.dumps(after, ensure_ascii=False),
                )
                if old_json not in raw and new_json in raw:
                    continue  # the same text in another place of the file: masked already
                if old_json not in raw:
                    raise SystemExit(f"{f}: a string to mask is not written as json.dumps writes it")
                raw = raw.replace(old_json, new_json)
            changed += bool(pairs)
        if changed:
            path.write_text(raw)
            print(f"{f}: {changed} state(s) masked")
            total += changed
    print(f"{total} state(s) masked")


if __name__ == "__main__":
    main()
