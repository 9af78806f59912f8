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
from eu_audit.serve.fields import CHAT, COMPLETIONS, FIELDS, MESSAGES, RESPONSES, fields_markdown
from eu_audit.serve.messages_api import MessagesRequest
from eu_audit.serve.responses_api import ResponsesRequest
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
    args += ["--control-file", str(folder / "serve.control"), "--max-tokens", "64"]
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
    models = {CHAT: ChatRequest, COMPLETIONS: CompletionRequest, RESPONSES: ResponsesRequest}
    for endpoint, model in (models | {MESSAGES: MessagesRequest}).items():
        named = [f.name for f in FIELDS[endpoint]]
        assert len(named) == len(set(named)), endpoint
        declared = {f.alias or n for n, f in model.model_fields.items()}
        assert declared <= set(named), (endpoint, declared - set(named))


def test_a_client_that_leaves_mid_stream_is_logged_with_what_was_sent() -> None:
    got: list[tuple[int, int]] = []

    async def leave_after_one() -> None:
        stream = events([(None, {"a": 1}), (None, {"b": 2})], lambda sent, total: got.append((sent, total)))
        await stream.__anext__()
        await stream.aclose()  # type: ignore[attr-defined]

    asyncio.run(leave_after_one())
    assert got == [(0, 3)]  # the first event was handed on; the client left before it counted as sent


def test_a_chat_answer_streams_while_it_decodes_and_its_deltas_join_to_the_non_streamed_answer(
    tmp_path: Path,
) -> None:
    """On a real model (SmolLM2-135M, llama.cpp): the content arrives in several deltas before the answer
    ends (the log says the stream was live), and joined they are the non-streamed answer exactly; the
    same for a response (the Responses API) and a message (the Messages API)."""
    from eu_audit.models import FAST_MODEL

    log = tmp_path / "serve.jsonl"
    args = ["serve", "--model", FAST_MODEL, "--log", str(log), "--control-file", str(tmp_path / "c")]
    ask = [{"role": "user", "content": "Write three sentences about the sea."}]
    kw: dict[str, Any] = {"model": "any", "messages": ask, "max_tokens": 48}
    with cli_server(*args) as url:
        # streamed first: the same request after it is answered again from it (serve.reuse, exact)
        chunks = list(client(url).chat.completions.create(**kw, stream=True))
        entry = last_entry(log)
        whole = client(url).chat.completions.create(**kw)
        # the Responses API and the Messages API stream the same way, each in its own events, through the
        # official clients (another subject each: nothing is answered again from an earlier request)
        got = [responses_live(url, log, "the moon"), messages_live(url, log, "the wind")]
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(deltas) == whole.choices[0].message.content
    assert entry["streamed"]["live"] and "diverged" not in entry, entry.get("streamed")
    assert len(deltas) >= 2, deltas  # sent as it was decoded, not in one piece at the end
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    for api, (streamed, live, text, final) in zip(("responses", "messages"), got, strict=True):
        assert live["streamed"]["live"] and "diverged" not in live, (api, live.get("streamed"))
        assert len(streamed) >= 2 and "".join(streamed) == text == final, (api, streamed, text)


def responses_live(url: str, log: Path, subject: str) -> tuple[list[str], dict, str, str]:
    """A response streamed (the openai client's event stream), its log entry, the same response not
    streamed, and the streamed one's final text; its id and item id are the ones its first events named."""
    prompt = f"Write three sentences about {subject}."
    kw: dict[str, Any] = {"model": "any", "input": prompt, "max_output_tokens": 48, "store": False}
    events = list(client(url).responses.create(**kw, stream=True))
    entry = last_entry(log)
    whole = client(url).responses.create(**kw)
    names = [e.type for e in events]
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] in ("response.completed", "response.incomplete")  # 48 tokens may cut it
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1].response
    assert done.id == events[0].response.id and done.output[0].id == events[2].item.id
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    return deltas, entry, whole.output_text, done.output_text


def messages_live(url: str, log: Path, subject: str) -> tuple[list[str], dict, str, str]:
    """A message streamed (the anthropic client's event stream), its log entry, the same message not
    streamed, and the streamed one's final text."""
    prompt = f"Write three sentences about {subject}."
    kw: dict[str, Any] = {"model": "any", "max_tokens": 48, "messages": [{"role": "user", "content": prompt}]}
    with anthropic_client(url).messages.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_message()
    entry = last_entry(log)
    whole = anthropic_client(url).messages.create(**kw)
    deltas = [
        e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"
    ]
    assert events[0].type == "message_start" and events[0].message.id == final.id
    assert final.usage.input_tokens == whole.usage.input_tokens > 0
    return deltas, entry, whole.content[0].text, final.content[0].text


# --- the Responses API and the Messages API -----------------------------------------------------------

JSON_TEXT = {"format": {"type": "json_object"}}  # held to JSON, the tiny model writes text


def test_a_responses_answer_streamed_is_the_one_not_streamed_and_logged_as_chat(
    serve: tuple[str, Path],
) -> None:
    url, log = serve
    kw: dict[str, Any] = {"model": "any", "input": "Say hello to Ada.", "instructions": "Be brief."}
    kw |= {"max_output_tokens": 12, "text": JSON_TEXT}
    whole = client(url).responses.create(**kw)
    entry = last_entry(log)
    assert entry["endpoint"] == "/v1/responses"
    assert entry["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hello to Ada."},
    ]
    assert whole.output_text and entry["reply"] == whole.output_text
    events = list(client(url).responses.create(**kw, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text and events[-1].type in ("response.completed", "response.incomplete")


def test_a_stored_response_is_read_again_by_the_next_one_so_its_z_is_in_the_logged_prompt(
    serve: tuple[str, Path],
) -> None:
    url, log = serve
    first = client(url).responses.create(model="any", input="My IBAN is DE89 3704 0044 0532 0130 00.",
                                         max_output_tokens=4)  # fmt: skip
    client(url).responses.create(
        model="any", input="What did I tell you?", previous_response_id=first.id, max_output_tokens=4
    )
    entry = last_entry(log)
    said = [m.get("content") for m in entry["messages"]]
    assert said[0] == "My IBAN is DE89 3704 0044 0532 0130 00." and said[-1] == "What did I tell you?"
    assert entry["previous_response_id"] == first.id


def test_a_responses_function_call_round_trip_becomes_chat_tool_calls(serve: tuple[str, Path]) -> None:
    url, log = serve
    tool = {"type": "function", "name": "book_taxi", "parameters": TAXI["function"]["parameters"]}
    got = client(url).responses.create(
        model="any", input="Taxi home.", tools=[tool], tool_choice={"type": "function", "name": "book_taxi"},
        max_output_tokens=12,
    )  # fmt: skip
    call = next(o for o in got.output if o.type == "function_call")
    client(url).responses.create(
        model="any", previous_response_id=got.id, max_output_tokens=4,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "booked"}],
    )  # fmt: skip
    messages = last_entry(log)["messages"]
    assert messages[-2]["tool_calls"][0]["function"]["name"] == "book_taxi"
    assert messages[-1] == {"role": "tool", "tool_call_id": call.call_id, "content": "booked"}


def test_the_openai_agents_sdk_runs_against_serve_with_its_default_model_the_responses_api(
    serve: tuple[str, Path],
) -> None:
    import openai
    from agents import Agent, ModelSettings, Runner, set_default_openai_client, set_tracing_disabled
    from pydantic import BaseModel

    class Greeting(BaseModel):
        friendly: bool

    url, log = serve
    set_tracing_disabled(True)
    set_default_openai_client(openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0))
    # a structured output: held to its schema, the tiny random model ends its answer (free, it runs to the
    # cap, and the SDK rightly refuses an incomplete response)
    agent = Agent(
        name="assistant",
        instructions="Be brief.",
        model="gpt-4o-mini",
        output_type=Greeting,
        model_settings=ModelSettings(max_tokens=64),
    )
    result = Runner.run_sync(agent, "Hello")
    assert isinstance(result.final_output, Greeting)
    entry = last_entry(log)
    assert entry["endpoint"] == "/v1/responses" and entry["status"] == 200, entry.get("error")
    assert entry["messages"][-1] == {"role": "user", "content": "Hello"}


def anthropic_client(url: str) -> Any:
    import anthropic

    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)


def test_an_anthropic_message_streamed_is_the_one_not_streamed_and_logged_as_chat(
    serve: tuple[str, Path],
) -> None:
    url, log = serve
    kw: dict[str, Any] = {"model": "any", "max_tokens": 12, "system": "Be brief."}
    kw["messages"] = [{"role": "user", "content": [{"type": "text", "text": "Say hello to Ada."}]}]
    kw |= {"tools": [{"name": "book_taxi", "input_schema": TAXI["function"]["parameters"]}]}
    kw["tool_choice"] = {"type": "tool", "name": "book_taxi"}  # held to the call: the tiny model writes it
    whole = anthropic_client(url).messages.create(**kw)
    entry = last_entry(log)
    assert entry["endpoint"] == "/v1/messages" and entry["messages"][0] == {
        "role": "system",
        "content": "Be brief.",
    }
    use = next(b for b in whole.content if b.type == "tool_use")
    assert use.name == "book_taxi" and whole.stop_reason == "tool_use"
    with anthropic_client(url).messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert [(b.type, getattr(b, "input", None)) for b in final.content] == [
        (b.type, getattr(b, "input", None)) for b in whole.content
    ]
    # the call's result goes back as a tool_result block: a tool message in the log
    kw["messages"] += [
        {"role": "assistant", "content": [b.model_dump() for b in whole.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "booked"}]},
    ]
    kw.pop("tool_choice")
    anthropic_client(url).messages.create(**kw)
    assert last_entry(log)["messages"][-1] == {"role": "tool", "tool_call_id": use.id, "content": "booked"}


def test_a_messages_field_serve_does_not_implement_is_a_400_naming_it(serve: tuple[str, Path]) -> None:
    import anthropic

    url, _ = serve
    with pytest.raises(anthropic.BadRequestError, match="field 'stop_sequences'"):
        anthropic_client(url).messages.create(
            model="any", max_tokens=4, messages=[{"role": "user", "content": "hi"}], stop_sequences=["x"]
        )
