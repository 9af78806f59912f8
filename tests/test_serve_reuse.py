"""Identical greedy requests are answered once (``eu_audit.serve.reuse``), and exactly: every answer,
reused or decoded, is the one a serve that decodes every request gives. The agent's tenant and the
positive control send the same requests until the forget; the second pays nothing for them."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from eu_audit.engines import Sampling
from eu_audit.engines.hf import HFEngine
from eu_audit.models import LoadedModel
from eu_audit.serve import Backend, Call, RequestLog, Routes, create_app
from eu_audit.serve.api import Limits
from eu_audit.serve.reuse import AnswerReuse

LANES = ("a" * 32, "b" * 32, "c" * 32)


@pytest.fixture
def make_routes(tiny: LoadedModel) -> Iterator[Any]:
    backends: list[Backend] = []

    def make(reuse: int) -> Routes:
        backends.append(Backend(engine=HFEngine(tiny), model_name="tiny"))
        return create_app(backends[-1], RequestLog(None), limits=Limits(reuse_answers=reuse)).state.routes

    yield make
    for b in backends:
        b.close()


def chat(r: Routes, lane: str, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    call = Call(deadline=time.monotonic() + 60, stopping=threading.Event(), lane=r.lane(lane))
    answer = r._chat(json.dumps({"model": "m", "max_tokens": 6, **body}).encode(), call)
    return answer, call.log


def conversation(turns: int, who: str = "ann") -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a brief assistant."},
        *({"role": "user", "content": f"{who} asks question {i}"} for i in range(turns)),
    ]


def test_a_tenant_that_repeats_another_tenants_greedy_requests_gets_the_same_answers_decoded_once(
    make_routes: Any,
) -> None:
    reusing, fresh = make_routes(4096), make_routes(0)
    sent = [(LANES[0], conversation(1)), (LANES[0], conversation(2)), (LANES[1], conversation(1))]
    sent += [(LANES[1], conversation(2)), (LANES[2], conversation(2, "bob")), (LANES[1], conversation(3))]
    for lane, messages in sent:
        got, log = chat(reusing, lane, {"messages": messages})
        want, plain = chat(fresh, lane, {"messages": messages})
        assert got["choices"] == want["choices"], (lane, messages)
        assert "reused" not in plain
        # reused where the same prompt was answered before on any lane; never a prompt first seen
        assert log.get("reused", False) is (lane == LANES[1] and len(messages) < 4), (lane, messages, log)
    assert reusing.reuse.reused == 2 and fresh.reuse.reused == 0


def test_an_answer_held_to_a_format_or_a_sampled_one_is_never_reused(make_routes: Any) -> None:
    r = make_routes(4096)
    shaped = {"messages": conversation(1), "response_format": {"type": "json_object"}}
    for lane in LANES[:2]:
        _, log = chat(r, lane, shaped)
        assert "reused" not in log
    assert r.reuse.reused == 0
    reuse = AnswerReuse(8)
    assert reuse.key([[1, 2, 3]], 6, Sampling(0.7, seed=1), True) is None
    assert reuse.key([[1, 2, 3]], 6, Sampling(), True) != reuse.key([[1, 2, 3]], 7, Sampling(), True)
    assert AnswerReuse(0).key([[1, 2, 3]], 6, Sampling(), True) is None


def test_the_reuse_map_is_bounded_and_keeps_the_most_recently_used() -> None:
    reuse = AnswerReuse(2)
    keys = [reuse.key([[i]], 6, Sampling(), True) for i in range(3)]
    reuse.put(keys[0], ([1], 1, "stop"))
    reuse.put(keys[1], ([2], 1, "stop"))
    assert reuse.get(keys[0]) == ([1], 1, "stop")  # now the most recent
    reuse.put(keys[2], ([3], 1, "stop"))
    assert reuse.get(keys[1]) is None and reuse.get(keys[0]) is not None and reuse.get(keys[2]) is not None
