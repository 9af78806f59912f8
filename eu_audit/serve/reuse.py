"""Identical greedy requests answered once (issue: a decided verdict costs sessions).

In a black-box session the agent's tenant and the positive control (B0) are the same agent on the same
episode until the forget, so their model calls before it are byte-identical; at pinned greedy decoding the
answer is a function of the prompt alone (the exactness every engine here is held to: a prompt decodes to
the same tokens whatever its lane's cache held). ``AnswerReuse`` keeps the answers of greedy requests by
what decides them, the rendered prompt's token ids (each segment), the completion budget and the loop
guard, and answers an equal request from the first answer. It is never used across anything that could
change the tokens: a sampled call (any temperature above 0, any seed), a reply held to a format or opened
as a forced call (their constraints are per request), or an answer that did not end on its own terms (a
client that left, a deadline). One serve runs one model, so the model is part of every key.

Every reused call is still the calling tenant's call: it is logged on its own lane, with its own mark,
messages and reply, and ``reused: true``. ``tests/test_serve_reuse.py`` holds it exact: every answer
equals what a serve without reuse gives.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence

from eu_audit.engines.base import Sampling

#: (generated ids with the closing marker, prompt tokens, finish reason)
Answer = tuple[list[int], int, str]


class AnswerReuse:
    """A bounded map from a greedy request's deciding inputs to its answer (least recently used out)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._answers: OrderedDict[str, Answer] = OrderedDict()
        self._lock = threading.Lock()
        self.reused = 0  # answers given again, for the progress line and the bench

    def key(self, segs: Sequence[Sequence[int]], budget: int, sampling: Sampling, guard: bool) -> str | None:
        """What decides a greedy answer, or None where the answer may not be reused."""
        if self.size <= 0 or sampling.temperature > 0:
            return None
        raw = json.dumps([[list(s) for s in segs], budget, guard], separators=(",", ":"))
        return hashlib.sha256(raw.encode()).hexdigest()

    def get(self, key: str | None) -> Answer | None:
        if key is None:
            return None
        with self._lock:
            got = self._answers.get(key)
            if got is not None:
                self._answers.move_to_end(key)
                self.reused += 1
            return None if got is None else (list(got[0]), got[1], got[2])

    def put(self, key: str | None, answer: Answer) -> None:
        if key is None:
            return
        with self._lock:
            self._answers[key] = (list(answer[0]), answer[1], answer[2])
            self._answers.move_to_end(key)
            while len(self._answers) > self.size:
                self._answers.popitem(last=False)
