"""Tool calls and reasoning end to end: the official ``openai`` and ``anthropic`` clients
against a real frontend whose token models name a tool-call and a reasoning parser.

``workers/scripted_token_worker.py`` registers one ``ModelInput.Tokens`` chat model per
parser pair of ``data/parser_goldens.json`` (model ``<tool parser>-<reasoning parser>``,
``none`` for no parser) and answers every request with a scripted model output, as token ids
of the model's tokenizer streamed a few at a time; the frontend detokenizes and parses them.
The script is chosen by a ``[[script:KEY]]`` marker in the prompt (the golden case's name, or
a script a test adds). Formats whose markers are special tokens of real models run on a copy
of the tiny model whose tokenizer has those markers as special tokens, so the frontend must
keep special tokens in the text for them.

The golden cases check what a client sees, streaming and not: ``message.tool_calls`` (id,
type, name, arguments JSON), ``reasoning_content``, ``content`` (``null`` when only calls),
``finish_reason``; the streamed deltas (``index``, ``id``, ``type`` and ``function.name``
first, then ``arguments`` pieces whose concatenation is the non-streaming arguments). The
malformed cases (invalid JSON, undeclared function, unterminated section) come back as
content with HTTP 200 and every character of the output.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import openai
import pytest
from serving_util import WORKERS, Procs, free_port, http, wait_for_instances

from dynamo._core import get_reasoning_parser_names, get_tool_parser_names
from dynamo.llm.tiny_model import write_tiny_model

pytestmark = pytest.mark.slow

GOLDENS = json.loads(
    (Path(__file__).resolve().parent / "data" / "parser_goldens.json").read_text(encoding="utf-8")
)
CASES = {c["name"]: c for c in GOLDENS["cases"]}
TOOLS = GOLDENS["tools"]

#: Markers that are special tokens of the models these parsers serve (Llama 3, Mistral,
#: DeepSeek (written with escapes: fullwidth bars and lower blocks), Kimi, gpt-oss).
#: Skipping special tokens would delete them from the text.
SPECIAL_MARKERS = [
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "<\uff5ctool\u2581calls\u2581begin\uff5c>",
    "<\uff5ctool\u2581calls\u2581end\uff5c>",
    "<\uff5ctool\u2581call\u2581begin\uff5c>",
    "<\uff5ctool\u2581call\u2581end\uff5c>",
    "<\uff5ctool\u2581sep\uff5c>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
]
SPECIAL_TOOL_PARSERS = {
    "llama3_json",
    "mistral",
    "deepseek_v3",
    "deepseek_v3_1",
    "kimi_k2",
    "harmony",
}
#: Parsers for which the frontend keeps special tokens (DeepSeek V3.2's DSML markers too).
KEEPS_SPECIAL = SPECIAL_TOOL_PARSERS | {"deepseek_v3_2"}

#: A chat template that renders what tool-using templates read: the tools, an assistant's
#: earlier ``tool_calls`` (their arguments as a mapping, as vLLM / HF templates iterate them)
#: and tool results with their call id.
TOOLS_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }}={{ t | tojson }};"
    "{% endfor %}</tools>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.content %}{{ m.content }}{% endif %}"
    "{% for tc in m.tool_calls or [] %}<call id={{ tc.id }}>{{ tc.function.name }}"
    "{% for k, v in tc.function.arguments | items %} {{ k }}={{ v }}{% endfor %}"
    " json={{ tc.function.arguments | tojson }}</call>{% endfor %}"
    "{% if m.role == 'tool' %} (result of {{ m.tool_call_id }}){% endif %}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

FINAL = "<think>\nGot the weather.\n</think>\n\nIt is sunny in Oslo."
#: The scripts of the behaviour tests (the golden cases may change; these do not).
ONE_CALL = (
    "Let me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
)
SEARCH_ARGUMENTS = {"query": "louvre", "filters": {"lang": ["fr", "en"], "n": {"max": 3}}}
TWO_CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    "<tool_call>\n"
    + json.dumps({"name": "search", "arguments": SEARCH_ARGUMENTS})
    + "\n</tool_call>\n"
)
THINK_CALL = (
    "<think>\nThe user wants weather.\n</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
)
PYTHONIC_CALLS = "[get_weather(city='San Francisco', days=3), search(query=\"it's\")]"
HARMONY_TEXT = (
    "<|channel|>analysis<|message|>Easy.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>It is 4.<|return|>"
)
UNICODE_ARGUMENTS = {
    "query": 'café "crème" 東京 🗼\\n',
    "filters": {"tags": ["ß", "ελληνικά", ""], "range": {"min": -1.5, "max": [1, {"deep": None}]}},
}
UNICODE_CALL = (
    "Voilà 🙂 — <tool_call>"
    + json.dumps({"name": "search", "arguments": UNICODE_ARGUMENTS}, ensure_ascii=False)
    + "</tool_call>"
)
EXTRA_SCRIPTS = {
    "one_call": ONE_CALL,
    "two_calls": TWO_CALLS,
    "think_call": THINK_CALL,
    "pythonic_calls": PYTHONIC_CALLS,
    "harmony_text": HARMONY_TEXT,
    "final_answer": FINAL,
    "unicode_nested": UNICODE_CALL,
    "plain": "Just text, no tools.",
    "ok": "ok",
}


def model_name(tool: str | None, reasoning: str | None) -> str:
    return f"{tool or 'none'}-{reasoning or 'none'}"


def case_model(case: dict) -> str:
    return model_name(case.get("tool_parser"), case.get("reasoning_parser"))


def _write_special_model(base: Path, out: Path) -> Path:
    from tokenizers import AddedToken, Tokenizer

    out.mkdir(parents=True)
    for f in base.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    tok = Tokenizer.from_file(str(base / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in SPECIAL_MARKERS])
    tok.save(str(out / "tokenizer.json"))
    return out


def _write_tools_model(base: Path, out: Path) -> Path:
    out.mkdir(parents=True)
    for f in base.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    config = json.loads((out / "tokenizer_config.json").read_text())
    config["chat_template"] = TOOLS_TEMPLATE
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


class Stack:
    def __init__(self, base: str, log: Path, scripts: Path, procs: Procs, kv: Path) -> None:
        self.base = base
        self.log = log
        self.scripts = scripts
        self.procs = procs
        self.kv = kv
        self.openai = openai.OpenAI(base_url=f"{base}/v1", api_key="x", timeout=30, max_retries=0)
        self.anthropic = anthropic.Anthropic(base_url=base, api_key="x", timeout=30, max_retries=0)

    def requests(self) -> list[dict]:
        """What the scripted worker received, in order."""
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def last_request(self, model: str) -> dict:
        return [r for r in self.requests() if r["model"] == model][-1]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("toolcalls")
    tiny = write_tiny_model(tmp / "tiny")
    special = _write_special_model(tiny, tmp / "special")
    tools_model = _write_tools_model(tiny, tmp / "tools")
    pairs = {(c.get("tool_parser"), c.get("reasoning_parser")) for c in GOLDENS["cases"]}
    # The behaviour tests' models, whatever the golden cases hold.
    pairs |= {(None, None), ("hermes", None), ("hermes", "qwen3"), ("pythonic", None)}
    pairs |= {("harmony", "gpt_oss")}
    models = []
    for tool, reasoning in sorted(pairs, key=lambda p: (p[0] or "", p[1] or "")):
        uses_special = tool in SPECIAL_TOOL_PARSERS or reasoning == "gpt_oss"
        models.append(
            {
                "name": model_name(tool, reasoning),
                "model_dir": str(special if uses_special else tiny),
                "tool_call_parser": tool,
                "reasoning_parser": reasoning,
            }
        )
    models.append(
        {"name": "templated", "model_dir": str(tools_model), "tool_call_parser": "hermes"}
    )
    models.append(
        {
            "name": "templated-keep",
            "model_dir": str(tools_model),
            "tool_call_parser": "hermes",
            "exclude_tools_when_tool_choice_none": False,
        }
    )
    scripts = tmp / "scripts.json"
    scripts.write_text(json.dumps({**{n: c["output"] for n, c in CASES.items()}, **EXTRA_SCRIPTS}))
    log = tmp / "requests.jsonl"
    log.touch()
    config = tmp / "worker.json"
    config.write_text(
        json.dumps({"models": models, "scripts": str(scripts), "log": str(log), "chunk": 3})
    )
    procs = Procs(tmp / "kv", tmp)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        procs.frontend(port, "--enable-anthropic-api")
        procs.start("scripted", [str(WORKERS / "scripted_token_worker.py"), str(config)])
        for m in models:
            wait_for_instances(base, m["name"], 1, timeout=60)
        yield Stack(base, log, scripts, procs, tmp / "kv")
    finally:
        procs.close()


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def script(key: str) -> str:
    return f"[[script:{key}]]"


def streamed(stream) -> dict:
    """A streamed chat completion folded into its parts; checks the tool-call delta order."""
    content, reasoning, finish = [], [], None
    calls: dict[int, dict] = {}
    for chunk in stream:
        for choice in chunk.choices:
            d = choice.delta
            if d.content:
                content.append(d.content)
            r = getattr(d, "reasoning_content", None)
            if r:
                reasoning.append(r)
            for tc in d.tool_calls or []:
                if tc.index not in calls:
                    # The first delta of a call names it; arguments follow.
                    assert tc.id and tc.type == "function", tc
                    assert tc.function and tc.function.name, tc
                    calls[tc.index] = {
                        "id": tc.id,
                        "name": tc.function.name,
                        "arguments": tc.function.arguments or "",
                    }
                else:
                    assert tc.id is None and tc.function.name is None, tc
                    calls[tc.index]["arguments"] += tc.function.arguments or ""
            if choice.finish_reason:
                finish = choice.finish_reason
    assert sorted(calls) == list(range(len(calls))), calls
    return {
        "content": "".join(content),
        "reasoning": "".join(reasoning),
        "calls": [calls[i] for i in sorted(calls)],
        "finish": finish,
    }


def arguments_value(text: str):
    """Arguments as JSON; text that is not JSON (a call whose arguments had streamed before
    the output turned out malformed, as the goldens record it) as the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def expected_content(case: dict) -> str | None:
    """The message content a client sees: blank text beside calls is ``null``."""
    content = case["content"]
    if case["calls"] and (content is None or not content.strip()):
        return None
    return content or None


# ---------------------------------------------------------------- golden cases


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_case_through_the_frontend(stack, name):
    case = CASES[name]
    args = {"model": case_model(case), "messages": ask(script(name))}
    if case.get("tool_parser"):
        args["tools"] = TOOLS
    r = stack.openai.chat.completions.create(**args)
    choice = r.choices[0]
    msg = choice.message
    assert msg.content == expected_content(case), msg
    assert (getattr(msg, "reasoning_content", None) or None) == case.get("reasoning"), msg
    got = [(c.function.name, arguments_value(c.function.arguments)) for c in msg.tool_calls or []]
    assert got == [(c["name"], c["arguments"]) for c in case["calls"]], msg
    for call, want in zip(msg.tool_calls or [], case["calls"], strict=True):
        assert call.type == "function" and call.id
        if "id" in want:
            assert call.id == want["id"]
    assert len({c.id for c in msg.tool_calls or []}) == len(case["calls"])
    assert choice.finish_reason == ("tool_calls" if case["calls"] else "stop")
    if not case["calls"] and not case.get("reasoning") and case.get("tool_parser") != "harmony":
        # Nothing parsed away: every character of the output is content (harmony's headers
        # are structure, not text).
        assert msg.content == case["output"]

    s = streamed(stack.openai.chat.completions.create(**args, stream=True))
    assert s["finish"] == choice.finish_reason
    # Streamed text is sent as it comes: blank text before a call is not held back.
    assert s["content"] == (case["content"] or "")
    assert (s["reasoning"] or None) == case.get("reasoning")
    assert [(c["name"], c["arguments"]) for c in s["calls"]] == [
        (c.function.name, c.function.arguments) for c in msg.tool_calls or []
    ]

    # One token per chunk: every marker and multi-byte character split; the same result.
    one = {**args, "messages": ask(script(name) + " [[chunk:1]]")}
    t = streamed(stack.openai.chat.completions.create(**one, stream=True))
    assert (t["content"], t["reasoning"], t["finish"]) == (
        s["content"],
        s["reasoning"],
        s["finish"],
    )
    assert [(c["name"], c["arguments"]) for c in t["calls"]] == [
        (c["name"], c["arguments"]) for c in s["calls"]
    ]

    # Markers that are special tokens stay in the text the parsers see.
    sent = stack.last_request(case_model(case))["output_options"] or {}
    special = case.get("tool_parser") in KEEPS_SPECIAL or (
        case.get("reasoning_parser") == "gpt_oss"
    )
    assert (sent.get("skip_special_tokens") is False) == special, sent


def test_every_required_parser_has_a_golden_case():
    tools = {c.get("tool_parser") for c in GOLDENS["cases"]}
    reasoning = {c.get("reasoning_parser") for c in GOLDENS["cases"]}
    for name in (
        "hermes",
        "llama3_json",
        "mistral",
        "pythonic",
        "qwen3_coder",
        "deepseek_v3_1",
        "kimi_k2",
        "harmony",
        "glm45",
    ):
        assert name in tools
    for name in ("basic", "deepseek_r1", "qwen3", "gpt_oss"):
        assert name in reasoning


@pytest.mark.parametrize("chunk", [1, 3])
def test_unicode_and_nested_arguments_round_trip(stack, chunk):
    args = {
        "model": "hermes-none",
        "messages": ask(f"{script('unicode_nested')} [[chunk:{chunk}]]"),
        "tools": TOOLS,
    }
    msg = stack.openai.chat.completions.create(**args).choices[0].message
    assert msg.content == "Voilà 🙂 — "
    (call,) = msg.tool_calls
    assert call.function.name == "search"
    assert json.loads(call.function.arguments) == UNICODE_ARGUMENTS
    s = streamed(stack.openai.chat.completions.create(**args, stream=True))
    assert s["content"] == "Voilà 🙂 — " and s["finish"] == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in s["calls"]] == [
        ("search", call.function.arguments)
    ]


def test_a_request_that_sets_skip_special_tokens_keeps_its_choice(stack):
    model = "harmony-gpt_oss"
    args = {"model": model, "messages": ask(script("harmony_text")), "tools": TOOLS}
    stack.openai.chat.completions.create(**args)
    assert stack.last_request(model)["output_options"]["skip_special_tokens"] is False
    r = stack.openai.chat.completions.create(**args, extra_body={"skip_special_tokens": True})
    assert stack.last_request(model)["output_options"]["skip_special_tokens"] is True
    # The markers were dropped by detokenization: no channel structure is left to parse.
    text = (r.choices[0].message.content or "") + (
        getattr(r.choices[0].message, "reasoning_content", None) or ""
    )
    assert "<|channel|>" not in text and "It is 4." in text


def test_concurrent_requests_keep_their_own_parse(stack):
    """Requests of several formats at once: no parser state leaks between them."""
    jobs = [
        ("hermes-none", "two_calls", ["get_weather", "search"]),
        ("hermes-qwen3", "think_call", ["get_weather"]),
        ("pythonic-none", "pythonic_calls", ["get_weather", "search"]),
        ("hermes-none", "plain", []),
    ] * 3

    def run(job):
        model, key, _ = job
        return streamed(
            stack.openai.chat.completions.create(
                model=model, messages=ask(f"{script(key)} [[chunk:1]]"), tools=TOOLS, stream=True
            )
        )

    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(run, jobs))
    for (model, key, names), got in zip(jobs, results, strict=True):
        assert [c["name"] for c in got["calls"]] == names, (model, key, got)
        assert got["finish"] == ("tool_calls" if names else "stop"), (model, key, got)
        if not names:
            assert got["content"] == EXTRA_SCRIPTS[key]


# ---------------------------------------------------------------- agent turn


def _agent_turn(stack, stream: bool) -> None:
    model = "hermes-qwen3"
    messages = ask(f"Weather in Oslo? {script('think_call')}")
    if stream:
        s = streamed(
            stack.openai.chat.completions.create(
                model=model, messages=messages, tools=TOOLS, stream=True
            )
        )
        assert s["finish"] == "tool_calls"
        assert s["reasoning"] == "\nThe user wants weather.\n"
        assert s["content"].strip() == ""
        call = s["calls"][0]
        call_id, name, arguments = call["id"], call["name"], call["arguments"]
    else:
        r = stack.openai.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls"
        assert msg.content is None
        assert msg.reasoning_content == "\nThe user wants weather.\n"
        (call,) = msg.tool_calls
        call_id, name, arguments = call.id, call.function.name, call.function.arguments
    assert name == "get_weather" and json.loads(arguments) == {"city": "Oslo"}

    messages.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            ],
        }
    )
    messages.append(
        {"role": "tool", "tool_call_id": call_id, "content": f"sunny {script('final_answer')}"}
    )
    if stream:
        s = streamed(
            stack.openai.chat.completions.create(
                model=model, messages=messages, tools=TOOLS, stream=True
            )
        )
        content, reasoning, finish, calls = s["content"], s["reasoning"], s["finish"], s["calls"]
    else:
        r = stack.openai.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        msg = r.choices[0].message
        content, reasoning = msg.content, msg.reasoning_content
        finish, calls = r.choices[0].finish_reason, msg.tool_calls or []
    assert reasoning == "\nGot the weather.\n"
    assert content.strip() == "It is sunny in Oslo."
    assert finish == "stop" and calls == []
    # The tool result reached the model's prompt.
    prompt = stack.last_request(model)["prompt"]
    assert "<|im_start|>tool\nsunny [[script:final_answer]]<|im_end|>" in prompt, prompt


def test_agent_turn(stack):
    _agent_turn(stack, stream=False)


def test_agent_turn_streaming(stack):
    _agent_turn(stack, stream=True)


# ---------------------------------------------------------------- tool_choice


@pytest.mark.parametrize("stream", [False, True])
def test_tool_choice_none_leaves_the_output_as_content(stack, stream):
    args = {
        "model": "hermes-none",
        "messages": ask(script("one_call")),
        "tools": TOOLS,
        "tool_choice": "none",
    }
    if stream:
        s = streamed(stack.openai.chat.completions.create(**args, stream=True))
        assert (s["content"], s["calls"], s["finish"]) == (ONE_CALL, [], "stop")
    else:
        r = stack.openai.chat.completions.create(**args)
        assert r.choices[0].message.content == ONE_CALL
        assert r.choices[0].message.tool_calls is None
        assert r.choices[0].finish_reason == "stop"


def test_tool_choice_required_uses_the_default_parser_without_a_model_parser(stack):
    args = {"messages": ask(script("one_call")), "tools": TOOLS}
    # No tool parser and `auto`: plain text.
    r = stack.openai.chat.completions.create(model="none-none", **args)
    assert r.choices[0].message.content == ONE_CALL
    assert r.choices[0].finish_reason == "stop"
    for model in ("none-none", "hermes-none"):
        r = stack.openai.chat.completions.create(model=model, tool_choice="required", **args)
        msg = r.choices[0].message
        assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [
            ("get_weather", {"city": "Paris", "days": 2})
        ], model
        assert msg.content == "Let me check.\n"
        assert r.choices[0].finish_reason == "tool_calls"


def test_tool_choice_required_without_a_call_in_the_output_is_text(stack):
    """No guided decoding forces the scripted model: its text is content."""
    r = stack.openai.chat.completions.create(
        model="hermes-none", messages=ask(script("plain")), tools=TOOLS, tool_choice="required"
    )
    assert r.choices[0].message.content == EXTRA_SCRIPTS["plain"]
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason == "stop"


def test_a_tool_choice_no_tool_can_satisfy_is_a_400(stack):
    named = {"type": "function", "function": {"name": "nope"}}
    for kw in (
        {"tool_choice": "required"},
        {"tool_choice": named},
        {"tool_choice": named, "tools": TOOLS},
    ):
        with pytest.raises(openai.BadRequestError) as e:
            stack.openai.chat.completions.create(
                model="hermes-none", messages=ask(script("plain")), **kw
            )
        assert e.value.body["param"] == "tool_choice", e.value.body


def test_each_choice_of_n_parses_its_own_calls(stack):
    r = stack.openai.chat.completions.create(
        model="hermes-none", messages=ask(script("two_calls")), tools=TOOLS, n=2
    )
    assert [c.index for c in r.choices] == [0, 1]
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert [c.function.name for c in choice.message.tool_calls] == ["get_weather", "search"]
    ids = [c.id for choice in r.choices for c in choice.message.tool_calls]
    assert len(set(ids)) == 4
    # Streamed, each choice has its own call indexes and finish reason.
    calls: dict[tuple[int, int], list[str]] = {}
    finishes = {}
    for chunk in stack.openai.chat.completions.create(
        model="hermes-none", messages=ask(script("two_calls")), tools=TOOLS, n=2, stream=True
    ):
        for choice in chunk.choices:
            for tc in choice.delta.tool_calls or []:
                calls.setdefault((choice.index, tc.index), []).append(tc.function.arguments or "")
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert sorted(calls) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for (_, index), pieces in calls.items():
        want = {"city": "Paris"} if index == 0 else SEARCH_ARGUMENTS
        assert json.loads("".join(pieces)) == want
    assert finishes == {0: "tool_calls", 1: "tool_calls"}


def test_streamed_usage_counts_every_token_of_a_tool_call_output(stack):
    chunks = list(
        stack.openai.chat.completions.create(
            model="hermes-none",
            messages=ask(script("two_calls")),
            tools=TOOLS,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    sent = stack.last_request("hermes-none")["output_tokens"]
    assert chunks[-1].usage.completion_tokens == sent > 0
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert [f for f in finishes if f] == ["tool_calls"]


def calls_content_finish(stack, args: dict, stream: bool) -> tuple[list, str | None, str]:
    """One chat completion, streamed or not: its calls as (name, parsed arguments), its
    content and its finish reason."""
    if stream:
        s = streamed(stack.openai.chat.completions.create(**args, stream=True))
        calls = [(c["name"], json.loads(c["arguments"])) for c in s["calls"]]
        return calls, s["content"], s["finish"]
    r = stack.openai.chat.completions.create(**args)
    msg = r.choices[0].message
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls]
    return calls, msg.content, r.choices[0].finish_reason


@pytest.mark.parametrize("stream", [False, True])
def test_named_tool_choice_keeps_only_that_function(stack, stream):
    args = {
        "model": "hermes-none",
        "messages": ask(script("two_calls")),
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "search"}},
    }
    calls, content, finish = calls_content_finish(stack, args, stream)
    assert calls == [("search", SEARCH_ARGUMENTS)]
    # The other call is text, as OpenAI treats a named choice (finish_reason stays stop).
    assert '"name": "get_weather"' in content and "<tool_call>" in content
    assert finish == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_keeps_the_first_call(stack, stream):
    args = {
        "model": "hermes-none",
        "messages": ask(script("two_calls")),
        "tools": TOOLS,
        "parallel_tool_calls": False,
    }
    calls, content, finish = calls_content_finish(stack, args, stream)
    assert calls == [("get_weather", {"city": "Paris"})]
    assert '"name": "search"' in content
    assert finish == "tool_calls"


def test_without_tools_in_the_request_nothing_is_parsed_as_a_call(stack):
    r = stack.openai.chat.completions.create(
        model="hermes-qwen3", messages=ask(script("think_call"))
    )
    msg = r.choices[0].message
    assert msg.tool_calls is None and r.choices[0].finish_reason == "stop"
    # Reasoning is still split off; the call section stays text.
    assert msg.reasoning_content == "\nThe user wants weather.\n"
    assert "<tool_call>" in msg.content and '"city": "Oslo"' in msg.content


def test_output_cut_by_max_tokens_inside_a_call_is_content(stack):
    full = ONE_CALL
    r = stack.openai.chat.completions.create(
        model="hermes-none", messages=ask(script("one_call")), tools=TOOLS, max_tokens=12
    )
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.tool_calls is None
    assert choice.message.content and full.startswith(choice.message.content)
    assert len(choice.message.content) < len(full)
    s = streamed(
        stack.openai.chat.completions.create(
            model="hermes-none",
            messages=ask(script("one_call")),
            tools=TOOLS,
            max_tokens=12,
            stream=True,
        )
    )
    assert (s["content"], s["calls"], s["finish"]) == (choice.message.content, [], "length")


# ---------------------------------------------------------------- chat template


def test_the_chat_template_gets_tools_and_earlier_tool_calls(stack):
    arguments = '{"city": "Oslo", "days": 2}'
    messages = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "user", "content": f"Thanks {script('ok')}"},
    ]
    r = stack.openai.chat.completions.create(model="templated", messages=messages, tools=TOOLS)
    assert r.choices[0].message.content == "ok"
    prompt = stack.last_request("templated")["prompt"]
    rendered = prompt.split("<tools>", 1)[1].split("</tools>", 1)[0]
    tools = [t.split("=", 1) for t in rendered.split(";") if t]
    assert [(name, json.loads(tool)) for name, tool in tools] == [
        (t["function"]["name"], t) for t in TOOLS
    ], prompt
    assert (
        "<|im_start|>assistant\n<call id=call_1>get_weather city=Oslo days=2"
        f" json={arguments}</call><|im_end|>"
    ) in prompt, prompt
    assert "<|im_start|>tool\nsunny (result of call_1)<|im_end|>" in prompt, prompt

    # `tool_choice: none` keeps the tools out of the prompt (and the output is text).
    stack.openai.chat.completions.create(
        model="templated", messages=messages, tools=TOOLS, tool_choice="none"
    )
    assert "<tools>" not in stack.last_request("templated")["prompt"]
    # Unless the card keeps them (`exclude_tools_when_tool_choice_none = False`).
    r = stack.openai.chat.completions.create(
        model="templated-keep", messages=messages, tools=TOOLS, tool_choice="none"
    )
    assert r.choices[0].message.content == "ok"
    assert "<tools>get_weather=" in stack.last_request("templated-keep")["prompt"]


def test_anthropic_and_responses_turns_reach_the_template_as_tool_calls(stack):
    stack.anthropic.messages.create(
        model="templated",
        max_tokens=20,
        tools=[ANTHROPIC_TOOL],
        messages=[
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "get_weather",
                        "input": {"city": "Oslo"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                    {"type": "text", "text": script("ok")},
                ],
            },
        ],
    )
    prompt = stack.last_request("templated")["prompt"]
    assert '<call id=toolu_1>get_weather city=Oslo json={"city": "Oslo"}</call>' in prompt, prompt
    assert "sunny (result of toolu_1)" in prompt, prompt
    assert "<tools>get_weather=" in prompt, prompt

    stack.openai.responses.create(
        model="templated",
        tools=[WEATHER_FUNCTION],
        input=[
            {"role": "user", "content": "Weather?"},
            {
                "type": "function_call",
                "call_id": "call_9",
                "name": "get_weather",
                "arguments": '{"city": "Rome", "days": 1}',
            },
            {"type": "function_call_output", "call_id": "call_9", "output": "rain"},
            {"role": "user", "content": script("ok")},
        ],
    )
    prompt = stack.last_request("templated")["prompt"]
    assert "<call id=call_9>get_weather city=Rome days=1" in prompt, prompt
    assert "rain (result of call_9)" in prompt, prompt


def test_arguments_that_are_not_json_reach_the_template_as_text(stack):
    """Arguments a template cannot iterate are passed through unchanged (the template,
    not the frontend, decides): this template iterates them, so it refuses the request."""
    messages = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "not json"},
                }
            ],
        },
        {"role": "user", "content": script("ok")},
    ]
    r = stack.openai.chat.completions.create(model="hermes-none", messages=messages, tools=TOOLS)
    assert r.choices[0].message.content == "ok"
    with pytest.raises(openai.BadRequestError):
        stack.openai.chat.completions.create(model="templated", messages=messages, tools=TOOLS)


# ---------------------------------------------------------------- Responses API

WEATHER_FUNCTION = {
    "type": "function",
    "name": TOOLS[0]["function"]["name"],
    "description": TOOLS[0]["function"]["description"],
    "parameters": TOOLS[0]["function"]["parameters"],
}


@pytest.mark.parametrize("stream", [False, True])
def test_responses_turn_through_the_parsers(stack, stream):
    conversation: list = [{"role": "user", "content": f"Weather in Oslo? {script('think_call')}"}]
    args = {"model": "hermes-qwen3", "input": conversation, "tools": [WEATHER_FUNCTION]}
    if stream:
        with stack.openai.responses.stream(**args) as s:
            events = list(s)
            first = s.get_final_response()
        kinds = [e.type for e in events]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
        assert "response.reasoning_text.delta" in kinds, kinds
        pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
        assert json.loads("".join(pieces)) == {"city": "Oslo"}
    else:
        first = stack.openai.responses.create(**args)
    assert first.status == "completed"
    # The blank text between `</think>` and the call is no message item.
    reasoning, call = first.output
    assert reasoning.type == "reasoning"
    assert reasoning.content[0].text == "\nThe user wants weather.\n"
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Oslo"} and call.call_id

    conversation += [item.model_dump(exclude_none=True) for item in first.output]
    conversation.append(
        {
            "type": "function_call_output",
            "call_id": call.call_id,
            "output": f"sunny {script('final_answer')}",
        }
    )
    second = stack.openai.responses.create(**{**args, "input": conversation})
    assert second.output_text.strip() == "It is sunny in Oslo."
    assert [o.type for o in second.output] == ["reasoning", "message"]


# ---------------------------------------------------------------- Anthropic Messages API

ANTHROPIC_TOOL = {
    "name": TOOLS[0]["function"]["name"],
    "description": TOOLS[0]["function"]["description"],
    "input_schema": TOOLS[0]["function"]["parameters"],
}


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_turn_through_the_parsers(stack, stream):
    messages: list = [{"role": "user", "content": f"Weather in Oslo? {script('think_call')}"}]
    args = {"model": "hermes-qwen3", "max_tokens": 200, "tools": [ANTHROPIC_TOOL]}
    if stream:
        with stack.anthropic.messages.stream(**args, messages=messages) as s:
            events = list(s)
            first = s.get_final_message()
        kinds = [e.type for e in events]
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
        deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
        assert "thinking_delta" in deltas and "input_json_delta" in deltas, deltas
    else:
        first = stack.anthropic.messages.create(**args, messages=messages)
    assert first.stop_reason == "tool_use"
    # The blank text between `</think>` and the call is no text block.
    blocks = first.content
    assert [b.type for b in blocks] == ["thinking", "tool_use"], first.content
    assert blocks[0].thinking == "\nThe user wants weather.\n"
    call = blocks[1]
    assert call.name == "get_weather" and call.input == {"city": "Oslo"}

    messages.append({"role": "assistant", "content": first.content})
    messages.append(
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": call.id,
                    "content": f"sunny {script('final_answer')}",
                }
            ],
        }
    )
    second = stack.anthropic.messages.create(**args, messages=messages)
    assert second.stop_reason == "end_turn"
    assert [b.type for b in second.content] == ["thinking", "text"]
    assert second.content[1].text.strip() == "It is sunny in Oslo."


# ---------------------------------------------------------------- choosing parsers


def test_parser_names_are_listed_sorted():
    tools, reasoning = get_tool_parser_names(), get_reasoning_parser_names()
    assert tools == sorted(set(tools)) and reasoning == sorted(set(reasoning))
    for name in (
        "hermes",
        "llama3_json",
        "mistral",
        "pythonic",
        "qwen3_coder",
        "qwen25",
        "deepseek_v3",
        "deepseek_v3_1",
        "deepseek_v3_2",
        "kimi_k2",
        "harmony",
        "phi4",
        "nemotron_deci",
        "glm45",
        "glm47",
        "jamba",
        "default",
    ):
        assert name in tools, name
    for name in (
        "basic",
        "deepseek_r1",
        "qwen3",
        "gpt_oss",
        "granite",
        "kimi",
        "mistral",
        "nemotron_deci",
        "nemotron_v3",
        "step3",
    ):
        assert name in reasoning, name


UNKNOWN_PARSER_SCRIPT = """
import asyncio, sys
from dynamo.llm import EntrypointArgs, EngineType, ModelInput, ModelRuntimeConfig, ModelType
from dynamo.llm import register_model
from dynamo.runtime import DistributedRuntime

async def main():
    rt = DistributedRuntime(asyncio.get_running_loop(), "mem", "tcp")
    for field in ("tool_call_parser", "reasoning_parser"):
        config = ModelRuntimeConfig()
        setattr(config, field, "bogus")
        try:
            await register_model(ModelInput.Tokens, ModelType.Chat,
                rt.endpoint("t.w.generate"), sys.argv[1], "m", runtime_config=config)
        except ValueError as e:
            print("register", field, e)
        try:
            EntrypointArgs(EngineType.Dynamic, runtime_config=config)
        except ValueError as e:
            print("entrypoint", field, e)
    rt.shutdown()

asyncio.run(main())
"""


def test_unknown_parser_names_are_refused_with_the_known_ones(tmp_path):
    model = write_tiny_model(tmp_path / "tiny")
    out = subprocess.run(
        [sys.executable, "-c", UNKNOWN_PARSER_SCRIPT, str(model)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split(" ")[:2] for line in lines] == [
        ["register", "tool_call_parser"],
        ["entrypoint", "tool_call_parser"],
        ["register", "reasoning_parser"],
        ["entrypoint", "reasoning_parser"],
    ], out.stdout
    for line in lines:
        assert "bogus" in line, line
    assert "hermes" in lines[0] and "qwen3_coder" in lines[0], lines[0]
    assert "deepseek_r1" in lines[2] and "gpt_oss" in lines[2], lines[2]

    cli = subprocess.run(
        [sys.executable, "-m", "dynamo.frontend", "--dyn-tool-call-parser", "bogus"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 2 and "bogus" in cli.stderr and "hermes" in cli.stderr, cli.stderr


@pytest.fixture(scope="module")
def flagged(stack):
    """A second frontend on the same discovery, with default parsers and no Anthropic API."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    stack.procs.frontend(
        port, "--dyn-tool-call-parser", "hermes", "--dyn-reasoning-parser", "qwen3"
    )
    wait_for_instances(base, "none-none", 1, timeout=60)
    wait_for_instances(base, "pythonic-none", 1, timeout=60)
    return openai.OpenAI(base_url=f"{base}/v1", api_key="x", timeout=30, max_retries=0), base


def test_frontend_parser_flags_apply_to_models_that_name_none(flagged):
    client, _ = flagged
    r = client.chat.completions.create(
        model="none-none", messages=ask(script("think_call")), tools=TOOLS
    )
    msg = r.choices[0].message
    assert msg.reasoning_content == "\nThe user wants weather.\n"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [
        ("get_weather", {"city": "Oslo"})
    ]
    assert r.choices[0].finish_reason == "tool_calls"


def test_the_model_card_parser_wins_over_the_frontend_flag(flagged):
    client, _ = flagged
    args = {"model": "pythonic-none", "tools": TOOLS}
    r = client.chat.completions.create(messages=ask(script("pythonic_calls")), **args)
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_weather", "search"]
    # A hermes section is no call for the card's pythonic parser.
    r = client.chat.completions.create(messages=ask(script("one_call")), **args)
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content == ONE_CALL


def test_messages_route_needs_the_anthropic_flag(stack, flagged):
    _, base = flagged
    body = json.dumps(
        {"model": "none-none", "max_tokens": 50, "messages": ask(script("plain"))}
    ).encode()
    status, _ = http("POST", f"{base}/v1/messages", body)
    assert status == 404
    status, answer = http("POST", f"{stack.base}/v1/messages", body)
    assert status == 200, answer
    assert json.loads(answer)["content"][0]["text"] == EXTRA_SCRIPTS["plain"]
