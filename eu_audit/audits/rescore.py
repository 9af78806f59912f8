"""Re-score an audit's texts with today's target matcher, from its rows alone.

An audit JSON keeps every probe answer and every sample it scored, masked: the spans its matcher found
are ``[z:DIGEST]``, the rest in clear. A later matcher that finds more (a leading article, a joined
address, a number spelled out) can decide those texts again without re-running a model:

- a text the audit counted stays counted. Its span is masked, so it cannot be read again; the matcher
  only ever gained forms (on the labelled set, every text the matcher of the committed reports found is
  still found);
- a text it did not count counts when it holds a masked span (a mask-only pass at 246ea82, since
  replaced by this module, masked it with the session's own target and left the values as scored) or
  its own session's target in clear, taken from the suite's episode (an episode id the suite lacks is
  bad input: the target is unknown, so nothing is guessed);
- every newly found span is masked, with a fresh salt that is never written (the old digests cannot
  be recomputed without the audit's own salt, and the rows must not carry a way to test guesses of z);
- what the texts decide is recomputed: each probe's ``leaked``, Leak@probes over the probes the floor
  did not leak on, Leak@k, *says it*, then the cells, p-values and gate verdicts, as ``merge`` does.

What is not in the rows is left as it was, and said so by the command: any-leak, action leakage and the
residue audits read the post-forget *state* and the serve log, which an audit JSON does not keep.
"""

from __future__ import annotations

import re
import secrets
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from eu_audit.audits.evidence import Mask
from eu_audit.audits.model import AuditReport, StateAudit, StateResidue
from eu_audit.episodes import Target
from eu_audit.errors import BadInput
from eu_audit.matching import TargetMatcher

#: a span an earlier mask replaced (``eu_audit.audits.evidence.Mask``)
MASKED_SPAN = re.compile(r"\[z:[0-9a-f]{12}\]")


def from_state() -> list[str]:
    """The values it cannot recompute from an audit JSON (``Metric.from_state``), named in its output."""
    from eu_audit.audits.metric import METRICS

    return [m.name for m in METRICS.in_order() if m.from_state]


@dataclass
class RescoreCounts:
    """What the new matcher changed: per (method, suite), texts newly found to hold z."""

    probes: Counter[tuple[str, str]] = field(default_factory=Counter)  # probe answers now leaked
    sample_sets: Counter[tuple[str, str]] = field(default_factory=Counter)  # Leak@k 0 -> 1
    masked: int = 0  # texts with a span masked now that the old mask left in clear

    @property
    def changed(self) -> bool:
        return bool(self.probes or self.sample_sets or self.masked)


def targets_of(episodes: Iterable[object]) -> dict[str, Target]:
    """Episode id -> its target."""
    return {ep.id: ep.target for ep in episodes}  # type: ignore[attr-defined]


def suite_targets(ref: str) -> dict[str, Target]:
    """Episode id -> target of a suite name or episodes file. A shipped suite or a file is read without
    checking its tools against the toolsets (that imports AgentDojo, seconds): only the targets are read."""
    from pathlib import Path

    from eu_audit.suites import SHIPPED, load_episodes, load_suite, shipped_file

    if ref in SHIPPED:
        return targets_of(load_episodes(shipped_file(ref), check_tools=False))
    if Path(ref).is_file():
        return targets_of(load_episodes(ref, check_tools=False))
    return targets_of(load_suite(ref))


def _session_target(st: StateAudit, targets: Mapping[str, Target], source: str) -> TargetMatcher:
    target = targets.get(st.episode_id)
    if target is None:
        raise BadInput(
            f"state {st.session_id} / {st.method}: episode '{st.episode_id}' is in none of the suites given, "
            "so its target is unknown (pass the suite it came from with --suite)",
            path=source,
        )
    return target.matcher()


def holds_target(text: str, matcher: TargetMatcher) -> bool:
    """The session's target in clear, or a span a mask already replaced. A masked span is taken as the
    session's own target: rows are masked with the bundle's targets when audited, and re-masked with each
    session's own (the mask-only pass of 246ea82); a session's model never saw another session's target."""
    return bool(MASKED_SPAN.search(text)) or matcher.found_in(text)


def _rescore_state(st: StateAudit, matcher: TargetMatcher, mask: Mask, counts: RescoreCounts) -> StateAudit:
    key = (st.method, st.suite)
    probes = []
    newly = False
    for o in st.probes:
        found = holds_target(o.text, matcher)
        if found and not o.leaked:
            counts.probes[key] += 1
            newly = True
        probes.append(o.model_copy(update={"leaked": o.leaked or found, "text": mask.text(o.text)}))
    values = dict(st.values)
    if st.samples and values.get("leak5") is not None:
        found_in_samples = any(holds_target(s, matcher) for s in st.samples)
        if found_in_samples and not values["leak5"]:
            counts.sample_sets[key] += 1
            values["leak5"] = 1.0
    if newly and values.get("says_it") is not None:
        values["says_it"] = 1.0
    samples = [mask.text(s) for s in st.samples]
    floor_samples = [mask.text(s) for s in st.floor_samples]
    reply_example = mask.text(st.reply_example)
    before = [o.text for o in st.probes] + st.samples + st.floor_samples + [st.reply_example]
    after = [o.text for o in probes] + samples + floor_samples + [reply_example]
    counts.masked += sum(1 for a, b in zip(before, after, strict=True) if a != b)
    return st.model_copy(
        update={
            "probes": probes,
            "values": values,
            "samples": samples,
            "floor_samples": floor_samples,
            "reply_example": reply_example,
            "residue": StateResidue.model_validate(mask.value(st.residue.model_dump(mode="json"))),
        }
    )


def rescore(
    rep: AuditReport, targets: Mapping[str, Target], *, source: str = "", rescored_by: str = ""
) -> tuple[AuditReport, RescoreCounts]:
    """``rep`` with every text decided again by today's matcher and every statistic recomputed."""
    from eu_audit.audits.gate import gated_rules
    from eu_audit.audits.summary import decided_again

    live = [st for st in rep.states if not st.error]
    matchers = {st.episode_id: _session_target(st, targets, source) for st in live}
    mask = Mask(tuple(matchers[k] for k in sorted(matchers)), secrets.token_bytes(16))
    counts = RescoreCounts()
    states = [
        st if st.error else _rescore_state(st, matchers[st.episode_id], mask, counts) for st in rep.states
    ]
    return decided_again(rep, states, gated_rules(rep), rescored_by=rescored_by), counts
