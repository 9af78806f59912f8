"""serve as deployed clients reach it: the official ``openai`` client and LangChain's ``ChatOpenAI``,
streamed and not. A streamed answer is the non-streamed one, character for character; a field serve does
not implement is refused with a 400 naming it, never silently ignored (``eu_audit.serve.fields``). Real
HTTP on loopback, the tiny random model (mechanics only)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eu_audit.models import TINY_MODEL
from eu_audit.serve.api import ChatRequest, CompletionRequest
from eu_audit.serve.fields import CHAT, COMPLETIONS, FIELDS, fields_markdown
from eu_audit.serve.stream import events

from .helpers import cli_server

DOCS = Path(__file__).resolve().parents[1] / "docs" / "serve-fields.md"
HELLO = [{"role": "user", "content": "Say hello to Ada."}]
TAXI = {
    "type": "function",
    "function": {
        "name": "book_taxi",
        "description": "book a taxi",
        "parameters": {"type": "object", "properties": {"pickup": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("serve-apis")
    log = folder / "serve.jsonl"
    args = ["serve", "--model", TINY_MODEL, "--engine", "hf", "--log", str(log)]
    args += ["--control-file", str(folder / "serve.control"), "--max-tokens", "12"]
    with cli_server(*args) as url:
        yield url, log


def client(url: str) -> Any:
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def last_entry(log: Path) -> dict[str, Any]:
    return json.loads(log.read_text().splitlines()[-1])


def test_a_streamed_chat_answer_is_the_non_streamed_one_with_its_usage_last(serve: tuple[str, Path]) -> None:
    url, log = serve
    # held to JSON, the tiny random model writes text (free, its tokens decode to nothing)
    kw: dict[str, Any] = {"model": "any", "messages": HELLO, "max_tokens": 12}
    kw["response_format"] = {"type": "json_object"}
    whole = client(url).chat.completions.create(**kw)
    chunks = list(
        client(url).chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    usage, asked = chunks[-1].usage, whole.usage
    assert chunks[-1].choices == [] and usage is not None and asked is not None
    # the same tokens; the cached count differs (the second call found the first's prompt in the cache)
    assert (usage.prompt_tokens, usage.completion_tokens) == (asked.prompt_tokens, asked.completion_tokens)
    entry = last_entry(log)
    assert (
        entry["reply"] == text and entry["streamed"]["sent"] == entry["streamed"]["events"] == len(chunks) + 1
    )


def test_a_streamed_tool_call_is_the_non_streamed_call(serve: tuple[str, Path]) -> None:
    url, _ = serve
    kw: dict[str, Any] = {
        "model": "any",
        "messages": HELLO,
        "tools": [TAXI],
        "tool_choice": {"type": "function", "function": {"name": "book_taxi"}},
        "max_tokens": 12,
    }
    whole = client(url).chat.completions.create(**kw).choices[0].message.tool_calls
    calls = [
        tc
        for c in client(url).chat.completions.create(**kw, stream=True)
        for tc in (c.choices[0].delta.tool_calls or [] if c.choices else [])
    ]
    assert whole and [(c.function.name, c.function.arguments) for c in calls] == [
        (c.function.name, c.function.arguments) for c in whole
    ]


def test_a_streamed_completion_is_the_non_streamed_text(serve: tuple[str, Path]) -> None:
    url, _ = serve
    whole = client(url).completions.create(model="any", prompt="Ada lives at", max_tokens=10)
    parts = client(url).completions.create(model="any", prompt="Ada lives at", max_tokens=10, stream=True)
    assert "".join(c.choices[0].text for c in parts if c.choices) == whole.choices[0].text


def test_langchains_streaming_chat_model_runs_against_serve_at_its_defaults(serve: tuple[str, Path]) -> None:
    from langchain_openai import ChatOpenAI

    url, log = serve
    llm = ChatOpenAI(base_url=url + "/v1", api_key="unused", model="any", streaming=True, max_tokens=12)
    said = "".join(str(c.content) for c in llm.stream("Say hello to Ada."))
    assert said == last_entry(log)["reply"] and last_entry(log)["streamed"]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"n": 3}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"stop": ["\n"]}, "stop"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frobnicate": True}, "frobnicate"),  # no row names it: refused, never ignored
    ],
)
def test_a_field_serve_does_not_implement_is_a_400_naming_it(
    serve: tuple[str, Path], extra: dict[str, Any], field: str
) -> None:
    import openai

    url, log = serve
    with pytest.raises(openai.BadRequestError, match=f"field '{field}'"):
        client(url).chat.completions.create(model="any", messages=HELLO, max_tokens=4, extra_body=extra)
    assert last_entry(log)["status"] == 400


def test_a_field_at_its_default_or_of_no_effect_is_served(serve: tuple[str, Path]) -> None:
    url, _ = serve
    extra = {"n": 1, "logprobs": False, "stop": None, "user": "u-1", "metadata": {"team": "x"}, "top_p": 0.9}
    got = client(url).chat.completions.create(
        model="any", messages=HELLO, max_tokens=4, parallel_tool_calls=False, tools=[TAXI], extra_body=extra
    )
    assert got.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_the_docs_table_is_the_code_and_names_every_field_a_request_declares() -> None:
    text = DOCS.read_text()
    assert fields_markdown() in text, "docs/serve-fields.md: rewrite its tables from fields_markdown()"
    for endpoint, model in ((CHAT, ChatRequest), (COMPLETIONS, CompletionRequest)):
        named = [f.name for f in FIELDS[endpoint]]
        assert len(named) == len(set(named)), endpoint
        declared = {f.alias or n for n, f in model.model_fields.items()}
        assert declared <= set(named), (endpoint, declared - set(named))


def test_a_client_that_leaves_mid_stream_is_logged_with_what_was_sent() -> None:
    got: list[tuple[int, int]] = []

    async def leave_after_one() -> None:
        stream = events([{"a": 1}, {"b": 2}], lambda sent, total: got.append((sent, total)))
        await stream.__anext__()
        await stream.aclose()  # type: ignore[attr-defined]

    asyncio.run(leave_after_one())
    assert got == [(0, 3)]  # the first event was handed on; the client left before it counted as sent
