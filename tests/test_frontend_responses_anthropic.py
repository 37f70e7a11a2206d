"""``POST /v1/responses`` (OpenAI Responses API) and ``POST /v1/messages`` (Anthropic
Messages API, opt-in with ``--enable-anthropic-api``) through a real frontend, with the
official ``openai`` and ``anthropic`` clients.

Two models: ``agent`` is a scripted ``ModelInput.Text`` worker (``workers/agent_worker.py``)
whose chat chunks carry ``reasoning_content`` and ``tool_calls`` as a chat path with
reasoning and tool-call parsers produces them, so a full agent turn (user → reasoning and
tool call → tool result → final answer) runs end to end, streaming and not; ``tiny`` is a
mocker (``ModelInput.Tokens``) whose prompts the frontend templates and tokenizes, for the
token counts and the output limit.

Reference 1.6.1 (observed with ``run_input(rt, "http", EngineType.Echo)``; see
``docs/compatibility.md``, issue 12): ``/v1/responses`` and ``/v1/responses/input_tokens``
are always served, ``/v1/messages`` and ``/v1/messages/count_tokens`` only with
``enable_anthropic_api`` (404 otherwise); ``previous_response_id`` and ``background: true``
answer 501; Anthropic errors use ``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import openai
import pytest
from serving_util import WORKERS, Procs, free_port, http, wait_for_instances

from dynamo.llm.tiny_model import write_tiny_model

pytestmark = pytest.mark.slow

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather of a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
ANTHROPIC_TOOL = {
    "name": "get_weather",
    "description": "The current weather of a city.",
    "input_schema": WEATHER_TOOL["parameters"],
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


class Stack:
    def __init__(self, base: str, marker: Path) -> None:
        self.base = base
        self.marker = marker
        self.openai = openai.OpenAI(base_url=f"{base}/v1", api_key="x", timeout=30, max_retries=0)
        self.anthropic = anthropic.Anthropic(base_url=base, api_key="x", timeout=30, max_retries=0)

    def requests(self) -> list[dict]:
        """The chat requests the agent worker received, in order."""
        return [json.loads(line) for line in self.marker.read_text().splitlines()]


@pytest.fixture(scope="module")
def stack(tmp_path_factory, model_dir):
    tmp = tmp_path_factory.mktemp("stack")
    procs = Procs(tmp / "kv", tmp)
    marker = tmp / "requests.jsonl"
    marker.touch()
    procs.env["MARKER"] = str(marker)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        procs.frontend(port, "--enable-anthropic-api")
        procs.start("agent", [str(WORKERS / "agent_worker.py"), str(model_dir), "agent"])
        procs.mocker(model_dir, "--speedup-ratio", "100")
        wait_for_instances(base, "agent", 1)
        wait_for_instances(base, "tiny", 1)
        yield Stack(base, marker)
    finally:
        procs.close()


# ---------------------------------------------------------------- Responses API


def test_responses_text_with_instructions(stack):
    r = stack.openai.responses.create(
        model="agent", input="hello there", instructions="Be brief.", temperature=0.5
    )
    assert r.status == "completed"
    assert r.output_text == "echo: hello there"
    assert r.instructions == "Be brief." and r.temperature == 0.5
    assert r.usage.output_tokens == 3 and r.usage.total_tokens == r.usage.input_tokens + 3
    sent = stack.requests()[-1]
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello there"},
    ]
    assert sent["temperature"] == 0.5


def test_responses_text_streams_the_responses_events(stack):
    events = list(
        stack.openai.responses.create(
            model="agent",
            input=[{"role": "user", "content": [{"type": "input_text", "text": "one two three"}]}],
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ], kinds
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ], kinds
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == "echo: one two three" and len(deltas) == 4
    done = events[-1].response
    assert done.output_text == "echo: one two three"
    assert [e.sequence_number for e in events] == list(range(len(events)))


def _agent_turn_responses(stack, stream: bool) -> None:
    """User → reasoning + tool call → tool result → final answer."""
    conversation: list = [{"role": "user", "content": "What is the weather in Paris?"}]
    if stream:
        with stack.openai.responses.stream(
            model="agent", input=conversation, tools=[WEATHER_TOOL]
        ) as s:
            events = list(s)
            first = s.get_final_response()
        kinds = [e.type for e in events]
        assert "response.reasoning_text.delta" in kinds, kinds
        args = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
        assert "".join(args) == '{"city": "Paris"}'
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert done[0].arguments == '{"city": "Paris"}'
    else:
        first = stack.openai.responses.create(
            model="agent", input=conversation, tools=[WEATHER_TOOL]
        )
    assert first.status == "completed"
    reasoning, call = first.output
    assert reasoning.type == "reasoning"
    assert reasoning.content[0].text == "The user wants the weather; call the tool."
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id == "call_paris" and json.loads(call.arguments) == {"city": "Paris"}
    sent = stack.requests()[-1]
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": WEATHER_TOOL["description"],
                "parameters": WEATHER_TOOL["parameters"],
            },
        }
    ]

    # The client sends the model's output items back with the tool's result.
    conversation += [item.model_dump(exclude_none=True) for item in first.output]
    conversation.append(
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    )
    second = stack.openai.responses.create(
        model="agent", input=conversation, tools=[WEATHER_TOOL], stream=False
    )
    assert second.output_text == "The weather in Paris is sunny."
    sent = stack.requests()[-1]["messages"]
    assert sent[1]["role"] == "assistant"
    assert sent[1]["reasoning_content"] == "The user wants the weather; call the tool."
    assert sent[1]["tool_calls"] == [
        {
            "id": "call_paris",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]
    assert sent[2] == {"role": "tool", "tool_call_id": "call_paris", "content": "sunny"}


def test_responses_agent_turn(stack):
    _agent_turn_responses(stack, stream=False)


def test_responses_agent_turn_streaming(stack):
    _agent_turn_responses(stack, stream=True)


def test_responses_parallel_calls_are_separate_items(stack):
    r = stack.openai.responses.create(
        model="agent", input="Weather in Paris and Oslo?", tools=[WEATHER_TOOL]
    )
    calls = [o for o in r.output if o.type == "function_call"]
    assert [(c.call_id, json.loads(c.arguments)) for c in calls] == [
        ("call_paris", {"city": "Paris"}),
        ("call_oslo", {"city": "Oslo"}),
    ]
    assert len({c.id for c in calls}) == 2


def test_responses_output_limit_makes_an_incomplete_response(stack):
    r = stack.openai.responses.create(model="agent", input="a b c d e f", max_output_tokens=3)
    assert r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text == "echo: a b"
    assert stack.requests()[-1]["max_completion_tokens"] == 3
    events = list(
        stack.openai.responses.create(
            model="agent", input="a b c d e f", max_output_tokens=3, stream=True
        )
    )
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


def test_responses_on_a_token_model_counts_tokens_like_input_tokens(stack):
    """The mocker path: the frontend templates and tokenizes; ``input_tokens`` counts the
    same prompt the generation uses."""
    args = {"model": "tiny", "input": "Hello there, how are you?", "instructions": "Be brief."}
    r = stack.openai.responses.create(**args, max_output_tokens=4)
    assert r.usage.output_tokens <= 4
    assert r.output and r.output[0].type == "message"
    status, body = http(
        "POST", f"{stack.base}/v1/responses/input_tokens", json.dumps(args).encode()
    )
    assert status == 200, body
    counted = json.loads(body)
    assert counted["object"] == "response.input_tokens"
    assert counted["input_tokens"] == r.usage.input_tokens > 0
    shorter = {"model": "tiny", "input": "Hello there, how are you?"}
    _, body = http("POST", f"{stack.base}/v1/responses/input_tokens", json.dumps(shorter).encode())
    assert json.loads(body)["input_tokens"] < counted["input_tokens"]


def test_responses_errors(stack):
    with pytest.raises(openai.NotFoundError):
        stack.openai.responses.create(model="nope", input="x")
    with pytest.raises(openai.BadRequestError) as e:
        stack.openai.responses.create(model="agent", input="x", extra_body={"bogus": 1})
    assert e.value.body["param"] == "bogus"
    with pytest.raises(openai.BadRequestError) as e:
        stack.openai.responses.create(model="agent", input="x", tools=[{"type": "web_search"}])
    assert e.value.body["param"] == "tools"
    # Nothing is stored: chaining on a previous response is refused, as by the reference.
    status, body = http(
        "POST",
        f"{stack.base}/v1/responses",
        json.dumps({"model": "agent", "input": "x", "previous_response_id": "resp_1"}).encode(),
    )
    assert status == 501 and json.loads(body)["error"]["param"] == "previous_response_id"
    # A bad chat-path value is reported under the Responses name of the field.
    with pytest.raises(openai.BadRequestError) as e:
        stack.openai.responses.create(model="tiny", input="x", temperature=7)
    assert "temperature" in str(e.value)


# ---------------------------------------------------------------- Anthropic Messages API


def test_anthropic_text_with_system_prompt(stack):
    m = stack.anthropic.messages.create(
        model="agent",
        max_tokens=50,
        system="Be brief.",
        messages=[{"role": "user", "content": "hello there"}],
    )
    assert m.type == "message" and m.role == "assistant"
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == "echo: hello there"
    assert m.stop_reason == "end_turn"
    assert m.usage.output_tokens == 3 and m.usage.input_tokens > 0
    sent = stack.requests()[-1]
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    assert sent["max_completion_tokens"] == 50


def test_anthropic_stream_events(stack):
    with stack.anthropic.messages.create(
        model="agent",
        max_tokens=50,
        messages=[{"role": "user", "content": [{"type": "text", "text": "one two"}]}],
        stream=True,
    ) as s:
        events = list(s)
    kinds = [e.type for e in events]
    assert kinds[:3] == ["message_start", "content_block_start", "content_block_delta"], kinds
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"], kinds
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == "echo: one two"
    assert events[-2].delta.stop_reason == "end_turn"
    assert events[-2].usage.output_tokens == 3


def _agent_turn_anthropic(stack, stream: bool) -> None:
    messages: list = [{"role": "user", "content": "What is the weather in Paris?"}]
    args = {"model": "agent", "max_tokens": 200, "tools": [ANTHROPIC_TOOL], "messages": messages}
    if stream:
        with stack.anthropic.messages.stream(**args) as s:
            events = list(s)
            first = s.get_final_message()
        deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
        assert "thinking_delta" in deltas and "input_json_delta" in deltas, deltas
    else:
        first = stack.anthropic.messages.create(**args)
    assert first.stop_reason == "tool_use"
    assert [b.type for b in first.content] == ["thinking", "tool_use"]
    assert first.content[0].thinking == "The user wants the weather; call the tool."
    call = first.content[1]
    assert call.name == "get_weather" and call.input == {"city": "Paris"}
    sent = stack.requests()[-1]
    assert sent["tools"][0]["function"]["parameters"] == ANTHROPIC_TOOL["input_schema"]

    messages.append({"role": "assistant", "content": first.content})
    messages.append(
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}],
        }
    )
    if stream:
        with stack.anthropic.messages.stream(**args) as s:
            final = s.get_final_message()
            assert s.current_message_snapshot.content[0].text == "The weather in Paris is sunny."
    else:
        final = stack.anthropic.messages.create(**args)
    assert final.stop_reason == "end_turn"
    assert final.content[0].text == "The weather in Paris is sunny."
    sent = stack.requests()[-1]["messages"]
    assert sent[1]["tool_calls"][0]["id"] == call.id
    assert json.loads(sent[1]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert sent[1]["reasoning_content"] == "The user wants the weather; call the tool."
    assert sent[2] == {"role": "tool", "tool_call_id": call.id, "content": "sunny"}


def test_anthropic_agent_turn(stack):
    _agent_turn_anthropic(stack, stream=False)


def test_anthropic_agent_turn_streaming(stack):
    _agent_turn_anthropic(stack, stream=True)


def test_anthropic_tool_choice_and_limits(stack):
    m = stack.anthropic.messages.create(
        model="agent",
        max_tokens=3,
        messages=[{"role": "user", "content": "a b c d e"}],
        tools=[ANTHROPIC_TOOL],
        tool_choice={"type": "none"},
        stop_sequences=["zzz"],
    )
    assert m.stop_reason == "max_tokens"
    assert m.content[0].text == "echo: a b"
    sent = stack.requests()[-1]
    assert sent["tool_choice"] == "none" and sent["stop"] == ["zzz"]
    stack.anthropic.messages.create(
        model="agent",
        max_tokens=30,
        messages=[{"role": "user", "content": "Paris?"}],
        tools=[ANTHROPIC_TOOL],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
    )
    sent = stack.requests()[-1]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert sent["parallel_tool_calls"] is False


def test_anthropic_count_tokens_matches_the_generation(stack):
    args = {
        "model": "tiny",
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Hello there, how are you?"}],
    }
    counted = stack.anthropic.messages.count_tokens(**args)
    m = stack.anthropic.messages.create(**args, max_tokens=4)
    assert counted.input_tokens == m.usage.input_tokens > 0
    assert m.usage.output_tokens <= 4


def test_anthropic_errors_use_the_anthropic_envelope(stack):
    with pytest.raises(anthropic.NotFoundError) as e:
        stack.anthropic.messages.create(
            model="nope", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "not_found_error"
    for body in (
        {"model": "agent", "messages": [{"role": "user", "content": "x"}]},
        {"model": "agent", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
        {"model": "agent", "max_tokens": 5, "messages": "x"},
    ):
        status, raw = http("POST", f"{stack.base}/v1/messages", json.dumps(body).encode())
        assert status == 400, raw
        error = json.loads(raw)
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    status, raw = http("POST", f"{stack.base}/v1/messages", b"{not json")
    assert status == 400 and json.loads(raw)["error"]["type"] == "invalid_request_error"


def test_openapi_lists_the_new_routes(stack):
    _, body = http("GET", f"{stack.base}/openapi.json")
    paths = json.loads(body)["paths"]
    for path in (
        "/v1/responses",
        "/v1/responses/input_tokens",
        "/v1/messages",
        "/v1/messages/count_tokens",
    ):
        assert "post" in paths[path], path
