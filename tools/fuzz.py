"""Feed mutated trace bundles and episode files through eu-audit's readers, the way a hostile reviewer
would, and count what happens. Every input must end one of two ways: refused cleanly (BadInput, exit 2,
naming the file and the line) or accepted and then processed without a crash. Anything else is a bug:
a crash (any other exception) or a hang (no answer within the time limit).

    python tools/fuzz.py --inputs 5000 --seed 0          # counts: inputs, refused, accepted, crashes, hangs
    python tools/fuzz.py --inputs 500 --unlearn           # also run unlearn -m b7 on every accepted bundle

The mutations are byte-level (flip, cut, duplicate, swap or drop lines) and structural (a value anywhere
in a record replaced with another type, a huge or negative number, text carrying markup or a lone
surrogate, a deep nesting, an id taken from another record, a key removed). ``tests/test_integrity.py``
runs a few hundred of them under hypothesis on every test run.

Semantic edits (``SEMANTIC_EDITS``) keep every line valid but make the bundle contradict itself: a block's
text emptied or cut before the target while its token ids keep it, a target, source or step text that
differs from the episode, a target that never occurs, a forget request for
what no observation holds or from a source none came from, a session removed with the end count fixed, an
enum that is not one, bytes that are not UTF-8. Each must be refused, at read or at the model stage,
never given a receipt.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eu_audit.bundle.io import read_bundle
from eu_audit.errors import BadInput
from eu_audit.suites import load_episodes

NASTY_TEXT = ["[/]", "[bold]x[/bold]", "\\ud800", "", " ", "b0", "b999", "s0", "c0", "\n", "x" * 3000]
NASTY_NUMBERS = [-1, 0, 1, 2, 3, 7, 10**6, 10**9, -(10**9), 2**63, 10**30, 0.5, -0.0]


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every location inside a JSON value."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:50]):
            yield from _paths(v, (*prefix, i))


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    parent[path[-1]] = value
    return obj


def _delete(obj: Any, path: tuple[Any, ...]) -> Any:
    if not path:
        return obj
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    del parent[path[-1]]
    return obj


def _get(obj: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        obj = obj[k]
    return obj


def _a_value(rng: random.Random, donors: list[Any]) -> Any:
    kind = rng.randrange(8)
    if kind == 0:
        return rng.choice(NASTY_NUMBERS)
    if kind == 1:
        return rng.choice(NASTY_TEXT)
    if kind == 2:
        return rng.choice([None, True, [], {}, [1, 2], {"a": 1}])
    if kind == 3:
        depth = rng.choice([3, 50, 70, 500])
        return json.loads("[" * depth + "]" * depth)
    if kind in (4, 5):  # a value from elsewhere in the file: an id, a list of ids, a span
        donor = rng.choice(donors)
        return json.loads(json.dumps(_get(donor, rng.choice(list(_paths(donor))))))
    if kind == 6:
        return rng.randrange(-5, 200)
    return "".join(rng.choice('ab01 [/]{}"\\é') for _ in range(rng.randrange(1, 12)))


def mutate_lines(lines: list[str], rng: random.Random) -> bytes:
    """One mutated copy of a JSONL file (lines with their newlines)."""
    lines = list(lines)
    op = rng.randrange(10)
    i = rng.randrange(len(lines))
    if op == 0:  # flip bytes
        raw = bytearray("".join(lines).encode())
        for _ in range(rng.randrange(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        return bytes(raw)
    if op == 1:
        del lines[i]
    elif op == 2:
        lines.insert(i, lines[rng.randrange(len(lines))])
    elif op == 3:
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    elif op == 4:
        cut = "".join(lines).encode()
        return cut[: rng.randrange(len(cut))]
    else:  # structural: a record stays valid JSON but says something else
        objs = [json.loads(x) for x in lines]
        rec = objs[i]
        for _ in range(rng.randrange(1, 3)):
            where = rng.choice(list(_paths(rec)))
            if op == 5 and where:
                with contextlib.suppress(KeyError, IndexError, TypeError):
                    _delete(rec, where)
            else:
                rec = _set(rec, where, _a_value(rng, objs))
        objs[i] = rec
        lines = [json.dumps(o) + "\n" for o in objs]
    return "".join(lines).encode()


# --- semantic edits: bundles whose every line is valid but which contradict themselves -------------------


def _records(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(x) for x in lines]


def _target_block(objs: list[dict[str, Any]]) -> dict[str, Any]:
    """The first block with token ids whose text holds its session's target."""
    targets = {o["session_id"]: o["episode"]["target"]["value"] for o in objs if o["type"] == "session"}
    for o in objs:
        if (
            o["type"] == "block"
            and o["block"]["token_ids"]
            and targets[o["session_id"]] in o["block"]["text"]
        ):
            return o
    raise ValueError("no block holds the target")


def _blank_text(objs: list[dict[str, Any]]) -> None:
    _target_block(objs)["block"]["text"] = ""


def _cut_text(objs: list[dict[str, Any]]) -> None:
    o = _target_block(objs)
    target = next(x["episode"]["target"]["value"] for x in objs if x.get("session_id") == o["session_id"])
    o["block"]["text"] = o["block"]["text"].split(target)[0]


def _first(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(o for o in objs if o["type"] == kind)


def _other_target(objs: list[dict[str, Any]]) -> None:
    """A trace@1 bundle (which kept a copy of the target beside the episode's) whose copy was edited."""
    objs[0]["schema_version"] = "eu-audit/trace@1"
    session = _first(objs, "session")
    session["target"] = {**session["episode"]["target"], "value": "Quay Street 99, Dunedin"}


def _other_source(objs: list[dict[str, Any]]) -> None:
    _first(objs, "session")["source_id"] = "src-elsewhere"


def _episode_text_edited(objs: list[dict[str, Any]]) -> None:
    ep = _first(objs, "session")["episode"]
    step = next(st for st in ep["steps"] if st["kind"] == "user")
    step["content"] += " (edited)"


def _target_never_occurs(objs: list[dict[str, Any]]) -> None:
    sess = _first(objs, "session")
    sess["episode"]["target"]["value"], sess["episode"]["target"]["variants"] = "Quay Street 99, Dunedin", []


def _forget_nowhere(objs: list[dict[str, Any]]) -> None:
    fr = _first(objs, "forget_request")
    fr["target"], fr["variants"] = "Nowhere Lane 77", []


def _forget_unknown_source(objs: list[dict[str, Any]]) -> None:
    fr = _first(objs, "forget_request")
    fr["source"] = "src-never-seen"


def _session_removed(objs: list[dict[str, Any]]) -> None:
    sids = [o["session_id"] for o in objs if o["type"] == "session"]
    if len(sids) < 2:
        raise ValueError("needs two sessions")
    objs[:] = [o for o in objs if o.get("session_id") != sids[-1]]
    objs[-1]["records"] = len(objs) - 1


def _policy_bogus(objs: list[dict[str, Any]]) -> None:
    objs[0]["checkpoint_policy"] = "bogus"


def _kind_bogus(objs: list[dict[str, Any]]) -> None:
    _first(objs, "observation")["kind"] = "telepathy"


SEMANTIC_EDITS: dict[str, Callable[[list[dict[str, Any]]], None]] = {
    "a block's text deleted while its ids keep z": _blank_text,
    "a block's text cut before z": _cut_text,
    "a trace@1 session's copy of the target differs from its episode's": _other_target,
    "the session's source_id differs from its episode's": _other_source,
    "an episode step's text differs from the recorded observation": _episode_text_edited,
    "the forget target never occurs in the session": _target_never_occurs,
    "the forget request names a target no observation holds (Nowhere Lane 77)": _forget_nowhere,
    "the forget request names a source no observation came from": _forget_unknown_source,
    "a whole session removed and the end count fixed": _session_removed,
    "checkpoint_policy not a policy": _policy_bogus,
    "an observation kind not a step kind": _kind_bogus,
}


def semantic_mutants(lines: list[str]) -> Iterator[tuple[str, bytes]]:
    """(what was edited, the edited bundle) for each edit that applies to this bundle, plus raw bytes that
    are not UTF-8 (an encoded surrogate) inside a text."""
    for name, edit in SEMANTIC_EDITS.items():
        objs = _records(lines)
        try:
            edit(objs)
        except (ValueError, StopIteration):
            continue
        yield name, "".join(json.dumps(o) + "\n" for o in objs).encode()
    raw = "".join(lines).encode()
    at = raw.index(b'"text": "') + len(b'"text": "') if b'"text": "' in raw else raw.index(b'"text":"') + 8
    yield "raw bytes that are not UTF-8 in a text", raw[:at] + b"\xed\xa0\x80" + raw[at:]


def semantic(source: Path, engine: Any, out_dir: Path) -> dict[str, str]:
    """Each semantic edit of ``source`` -> 'refused at read', 'refused at the model stage' or 'ACCEPTED'
    (with ``unlearn -m b7``'s receipt: an inconsistent bundle must never get one)."""
    from eu_audit.unlearn import check_bundle_model, unlearn

    results = {}
    for i, (name, data) in enumerate(semantic_mutants(source.read_text().splitlines(keepends=True))):
        path = out_dir / f"semantic-{i}.jsonl"
        path.write_bytes(data)
        try:
            bundle = read_bundle(path)
        except BadInput:
            results[name] = "refused at read"
            continue
        try:
            check_bundle_model(bundle, engine)
        except BadInput:
            results[name] = "refused at the model stage"
            continue
        res = unlearn(path, ["b7"], out_dir / f"semantic-{i}.b7.jsonl", force=True, engine=engine)
        clean = all(r.clean for _, _, _, r in res.rows)
        results[name] = f"ACCEPTED ({'clean' if clean else 'not clean'} receipt)"
    return results


class Hang(Exception):
    pass


class Unplaced(Exception):
    """A clean refusal that names neither the file nor the line."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    def _raise(signum: int, frame: object) -> None:
        raise Hang

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@dataclass
class Tally:
    counts: Counter[str] = field(default_factory=Counter)
    crashes: list[str] = field(default_factory=list)
    unplaced: list[str] = field(default_factory=list)  # refusals that do not say where

    def line(self) -> str:
        c = self.counts
        return (
            f"inputs {sum(c.values())}, refused cleanly {c['refused']}, accepted and processed "
            f"{c['accepted']}, refused without a line {c['no line']}, crashes {c['crash']}, hangs {c['hang']}"
        )


def outcome(path: Path, read: Callable[[Path], Any], process: Callable[[Any], None], limit: float) -> str:
    """'refused' (BadInput naming the file and line) or 'accepted' (read and processed); raises Unplaced
    for a refusal that does not say where, Hang or the crash itself otherwise."""
    try:
        with time_limit(limit):
            obj = read(path)
            process(obj)
    except BadInput as exc:
        if exc.path is None and exc.line is None:
            raise Unplaced(str(exc)) from None
        return "refused"
    return "accepted"


def process_bundle(engine: Any = None, unlearn_out: Path | None = None) -> Callable[[Any], None]:
    """What downstream commands do with an accepted bundle: its graph, receipts and inspect's rendering;
    with an engine, the token checks and a rebuild of every state; with ``unlearn_out``, unlearn b7."""
    from eu_audit.trace.records import ForgetRequestRecord
    from eu_audit.trace.state import rebuild_state
    from eu_audit.unlearn import check_bundle_model, receipt, unlearn

    def run(bundle: Any) -> None:
        for trace in bundle.sessions:
            trace.tau()
            trace.closure()
            t = trace.session.target
            receipt(
                trace,
                "recorded",
                ForgetRequestRecord(session_id=trace.session_id, target=t.value, variants=t.variants),
            )
        if engine is not None:
            check_bundle_model(bundle, engine)
            for trace in bundle.sessions:
                rebuild_state(engine, trace)
        if unlearn_out is not None and not any(s.session.method for s in bundle.sessions):
            unlearn(bundle.path, ["b7"], unlearn_out, force=True, engine=engine)

    return run


def process_episodes(episodes: Any) -> None:
    from eu_audit.suites.checks import scripted_observations

    for ep in episodes:
        scripted_observations(ep, "factual")
        scripted_observations(ep, "counterfactual")


def fuzz(
    source: Path,
    kind: str,
    n: int,
    seed: int,
    *,
    engine: Any = None,
    unlearn: bool = False,
    limit: float = 60.0,
    progress: bool = False,
) -> Tally:
    lines = source.read_text().splitlines(keepends=True)
    rng = random.Random(seed)
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="eu-audit-fuzz-") as tmp:
        path = Path(tmp) / f"mutant{source.suffix}"
        out = Path(tmp) / "unlearned.jsonl" if unlearn else None
        read: Callable[[Path], Any] = read_bundle if kind == "bundle" else load_episodes
        process = process_bundle(engine, out) if kind == "bundle" else process_episodes
        for i in range(n):
            path.write_bytes(mutate_lines(lines, rng))
            try:
                tally.counts[outcome(path, read, process, limit)] += 1
            except Unplaced as exc:
                tally.counts["no line"] += 1
                tally.unplaced.append(f"input {i}: {exc}")
            except Hang:
                tally.counts["hang"] += 1
                tally.crashes.append(f"input {i}: hang")
            except Exception:  # the point: anything but BadInput is a crash
                tally.counts["crash"] += 1
                tally.crashes.append(f"input {i}: {traceback.format_exc(limit=-3)}")
                (Path(tmp).parent / f"eu-audit-fuzz-crash-{seed}-{i}{source.suffix}").write_bytes(
                    path.read_bytes()
                )
            if progress and (i + 1) % 100 == 0:
                print(f"  {kind} {i + 1}/{n}: {tally.line()}", file=sys.stderr)
    return tally


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=2000, help="mutants of each kind (bundle, episodes)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--unlearn", action="store_true", help="run unlearn -m b7 on every accepted bundle")
    args = ap.parse_args()

    from eu_audit.engines import open_engine
    from eu_audit.models import TINY_MODEL, load_model
    from eu_audit.record import RecordOptions, record
    from eu_audit.suites import data_dir

    loaded = load_model(TINY_MODEL)
    engine = open_engine("hf", TINY_MODEL, loaded=loaded)
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "trace.jsonl"
        record(RecordOptions(model=TINY_MODEL, out=bundle, n=1), loaded=loaded)
        t0 = time.perf_counter()
        b = fuzz(bundle, "bundle", args.inputs, args.seed, engine=engine, unlearn=args.unlearn, progress=True)
        t1 = time.perf_counter()
        two = Path(tmp) / "two.jsonl"
        record(RecordOptions(model=TINY_MODEL, out=two, n=2), loaded=loaded)
        sem = semantic(two, engine, Path(tmp))
    e = fuzz(data_dir("suites") / "builtin.jsonl", "episodes", args.inputs, args.seed, progress=True)
    t2 = time.perf_counter()
    print(f"bundles   ({t1 - t0:.0f} s): {b.line()}")
    print(f"episodes  ({t2 - t1:.0f} s): {e.line()}")
    accepted = [name for name, got in sem.items() if got.startswith("ACCEPTED")]
    print(f"semantic edits: {len(sem)}, refused {len(sem) - len(accepted)}, accepted {len(accepted)}")
    for name, got in sem.items():
        print(f"  {got:28} {name}")
    for c in [*b.crashes, *e.crashes, *b.unplaced, *e.unplaced][:20]:
        print(c)
    bad = b.crashes or e.crashes or b.counts["no line"] or e.counts["no line"] or accepted
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
