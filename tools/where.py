"""Where the target survived, read from black-box bundles: per session, what the agent's forget answered,
which prompt tiers still carried z after it (serve log) and which stores still hold it (dump), with one
quoted example each. Prints Markdown for the reports in this folder.

    python tools/where.py RUN_DIR [RUN_DIR ...]   # folders written by gate.sh
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from eu_audit.blackbox.residue import prompt_parts
from eu_audit.matching import TargetMatcher
from eu_audit.serve.api import LogEntry
from eu_audit.tiers import AFTER, EMBEDDING, ROLE_TIERS, tier_ids


def quote(text: str, width: int = 160) -> str:
    text = " ".join(text.split())
    return (text[: width - 1] + "…") if len(text) > width else text


def callers(folder: Path, tenant: str, matcher: TargetMatcher) -> Counter[str]:
    """The model calls after the forget that carried z, by who made them: the opening words of each call's
    system prompt. A tier names a message's role only, and a memory library's own calls (an extraction
    prompt that renders the last messages as text in one user turn) land in the same tier as the agent's
    history; the system prompt tells them apart. gate.sh gives each run its own serve, so its log holds
    this run's calls only."""
    log = folder / "serve.jsonl"
    seen: Counter[str] = Counter()
    if not log.exists():
        return seen
    for line in log.read_text().splitlines():
        e = LogEntry.model_validate_json(line)  # serve's log, read as serve wrote it
        if e.mark is None or e.mark.tenant != tenant or e.mark.phase not in AFTER:
            continue
        parts = prompt_parts(e)  # (tier, text) as the residue check reads the call
        if not any(matcher.found_in(text) for _, text in parts):
            continue
        if parts[0][0] == EMBEDDING:
            seen["an embedding request"] += 1
            continue
        system = parts[0][1] if parts[0][0] == ROLE_TIERS["system"] else "(no system prompt)"
        opening = quote(system, 48)
        seen["(an opening that holds z)" if matcher.found_in(opening) else opening] += 1
    return seen


def main(folders: list[str]) -> None:
    for folder in map(Path, folders):
        run = json.loads((folder / "run.json").read_text())
        records = [json.loads(x) for x in (folder / "bundle.jsonl").read_text().splitlines()]
        print(
            f"#### {run['agent']} (forget: {run['forget']}), {run['suite']}, n = {run['n']}, k = {run['k']}: "
            f"gate exit {run['gate_exit']}; record {run['record_s']} s, audit {run['audit_s']} s"
        )
        print()
        forgets = {r["session_id"]: r for r in records if r["type"] == "agent_forget"}
        # serve's log names a tenant by an opaque name only; the bundle's session line says which
        tenants = {r["session_id"]: r.get("tenant") or "" for r in records if r["type"] == "session"}
        # z is stored once, in the session's episode (a trace@1 line kept a copy beside it)
        targets = {
            r["session_id"]: r["episode"]["target"] if "episode" in r else r["target"]
            for r in records
            if r["type"] == "session"
        }
        for r in records:
            if r["type"] != "residue" or not r["session_id"].endswith("/agent"):
                continue
            if r.get("after"):
                recheck(r)
                continue
            sid = r["session_id"]
            f = forgets.get(sid, {})
            ctx = f"{r['context_calls_with_z']} of {r['context_calls']} model calls after the forget"
            # by the channels' gate names (prompt.user, store.history), as the reports' tables
            held = sorted(tier_ids(r["context_tiers"]).items())  # a bundle from before tier ids: its labels
            tiers = ", ".join(f"prompt.{k} {v}" for k, v in held) or "none"
            stores = ", ".join(f"store.{k} {v}" for k, v in sorted(r["store_tiers"].items())) or "none"
            print(f"- `{sid}`: forget answered *{f.get('detail', '?')}*; z reached {ctx} (tiers: {tiers});")
            print(f"  the dump holds z in {r['store_items_with_z']} of {r['store_items']} items ({stores}).")
            target = targets.get(sid) or {}
            made = (
                callers(
                    folder,
                    tenants.get(sid, ""),
                    TargetMatcher.of(target["value"], target.get("variants") or []),
                )
                if target.get("value")
                else Counter()
            )
            if made:
                by = "; ".join(f'"{k}" {v}' for k, v in made.most_common())
                print(f"  - those calls by their system prompt's opening: {by}")
            if r["context_example"]:
                print(f'  - prompt after the forget: "{quote(r["context_example"])}"')
            if r["store_example"]:
                print(f'  - store item: "{quote(r["store_example"])}"')
        print()


def recheck(r: dict) -> None:
    """One recheck event's record (record --recheck): what held z after it, or why it did not run."""
    if r.get("skipped"):
        print(f"  - after {r['after']}: not run ({r['skipped']})")
        return
    held = [
        f"{r[k]} of {r[n]} {what}"
        for k, n, what in (
            ("context_calls_with_z", "context_calls", "model calls"),
            ("replies_with_z", "replies", "answers"),
            ("store_items_with_z", "store_items", "dump items"),
        )
        if r.get(n)  # None: not observed; 0: the event had none (at-once asks nothing, calls no model)
    ]
    print(f"  - after {r['after']}: z in {'; '.join(held)}")
    for key, what in (
        ("reply_example", "answer"),
        ("context_example", "prompt"),
        ("store_example", "store item"),
    ):
        if r.get(key):
            print(f'    - {what}: "{quote(r[key])}"')


if __name__ == "__main__":
    main(sys.argv[1:])
