"""Loader for the real LongMemEval data (``longmemeval_s.json`` / ``_m`` / ``_oracle``), read from a path
the user supplies (``--suite longmemeval:PATH``); the data set is not redistributed here.

Each instance (question_id, question_type, question, answer, haystack_sessions of {role, content,
has_answer}, answer_session_ids) becomes one episode: the user turns before the first evidence turn
(``has_answer``) are the setup, the evidence turn is the acquisition step (its counterfactual is the same
turn with the answer withheld), the LongMemEval question is a future query with the answer as its
expected output, and the haystack's later user turns follow. Instances whose answer is not stated
verbatim in an evidence turn (abstention and many multi-session questions) cannot name a target string
and are skipped; the loader says how many.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from eu_audit.datasets import WITHHELD
from eu_audit.episodes import Episode, Step, StepKind, Target
from eu_audit.errors import BadInput
from eu_audit.jsonl import check_input_file, describe_validation_error
from eu_audit.matching import contains_target, normalise
from eu_audit.suites import LOADERS
from eu_audit.suites.build import rng_for
from eu_audit.suites.compose import EpisodeParts, Knobs, compose

_GENERIC = [
    "Can you suggest a quick dinner idea?",
    "What is a good stretch for a stiff neck?",
    "Give me a one-line motivational quote.",
]


class LongMemEvalTurn(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str
    has_answer: bool = False


class Instance(BaseModel):
    model_config = ConfigDict(extra="allow")
    question_id: str
    question_type: str
    question: str
    answer: str | int | float
    haystack_sessions: list[list[LongMemEvalTurn]]
    answer_session_ids: list[str | int] = []


_INSTANCES = TypeAdapter(list[Instance])


def _withhold(text: str, answer: str) -> str:
    low, key = text.lower(), answer.lower()
    i = low.find(key)
    return text if i < 0 else text[:i] + WITHHELD + text[i + len(answer) :]


def instance_parts(inst: Instance) -> EpisodeParts | None:
    answer = str(inst.answer).strip()
    turns = [t for session in inst.haystack_sessions for t in session if t.role == "user"]
    evidence = next(
        (k for k, t in enumerate(turns) if t.has_answer and answer.lower() in t.content.lower()), None
    )
    if evidence is None or len(normalise(answer)) < 3:
        return None
    before, after = turns[:evidence], turns[evidence + 1 :]
    if any(contains_target(t.content, answer) for t in before + after):
        after = [t for t in after if not contains_target(t.content, answer)]
        before = [t for t in before if not contains_target(t.content, answer)]
    ev = turns[evidence].content
    return EpisodeParts(
        id=f"longmemeval-{inst.question_id}",
        suite="longmemeval",
        description=f"LongMemEval {inst.question_type}: {inst.question}",
        target=Target(value=answer, kind="fact"),
        opening=[],
        setup_pool=[Step(kind=StepKind.user, content=t.content) for t in before],
        acquisition=Step(
            kind=StepKind.user,
            content=ev,
            counterfactual=_withhold(ev, answer),
            source=f"src-{inst.question_id}",
        ),
        answer=Step(kind=StepKind.user, content=inst.question, expect=[answer]),
        plan=Step(kind=StepKind.plan, content="Write down what you will remember about this for next time."),
        dependent=[Step(kind=StepKind.user, content=t.content) for t in after]
        or [Step(kind=StepKind.user, content=inst.question, expect=[answer])],
        independent=[Step(kind=StepKind.user, content=q) for q in _GENERIC],
        meta={"source": "LongMemEval", "question_id": inst.question_id, "question_type": inst.question_type},
    )


def load_longmemeval(path: Path, knobs: Knobs | None = None) -> list[Episode]:
    knobs = knobs or Knobs()
    if not path.is_file():
        raise BadInput(
            f"{path}: no such file. LongMemEval is not bundled: download longmemeval_s.json (or _m, "
            "_oracle) from the LongMemEval authors' release and pass --suite longmemeval:PATH"
        )
    check_input_file(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"), parse_constant=float)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(f"not valid JSON: {exc}", path=str(path)) from None
    except (RecursionError, ValueError) as exc:
        raise BadInput(f"not a LongMemEval file: {type(exc).__name__}", path=str(path)) from None
    try:
        instances = _INSTANCES.validate_python(raw)
    except ValidationError as exc:
        where, msg = describe_validation_error(exc)
        raise BadInput(f"not a LongMemEval instance list: {msg}", path=str(path), field=where) from None
    episodes = []
    for inst in instances:
        parts = instance_parts(inst)
        if parts is not None:
            episodes.append(compose(parts, knobs, rng_for(knobs, parts.id)))
    if not episodes:
        raise BadInput(
            f"none of the {len(instances)} instances states its answer verbatim in an evidence "
            "turn; no target strings to forget",
            path=str(path),
        )
    return episodes[: knobs.n] if knobs.n else episodes


LOADERS.add("longmemeval", load_longmemeval)
