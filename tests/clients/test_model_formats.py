"""Tool calls in the formats of the 2026 model families, through the official client packages:
gpt-oss's Harmony (a commentary message to `functions.get_weather`), Qwen3-Coder's XML
(`<function=..><parameter=..>`, values typed from the tool's schema; Qwen3.5 / 3.6 write it after
a thought, thinking being on by default), GLM-4.5/4.6's key and value tags, Kimi K2's call sections, Gemma 4's
and LFM2's Python list of calls. The models are scripted
(`fastmlx make-test-model --scripted`): tiny computed models that write one tool call in the
family's format, with the family's published chat template and special tokens, so what is
tested is what the server makes of that output in each API."""

import json
import subprocess

import anthropic
import openai
import pytest

from conftest import BINARY, ROOT, launch

TEMPLATES = ROOT / "tests/data/chat_templates"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
ANTHROPIC_WEATHER = {"name": "get_weather", "description": "The weather in a city",
                     "input_schema": WEATHER["function"]["parameters"]}
# What each scripted model calls get_weather with.
EXPECTED = {"harmony": {"city": "Paris"}, "qwen-xml": {"city": "Paris", "days": 3}, "gemma4": {"days": 3},
            "qwen3.5": {"city": "Paris", "days": 3}, "pythonic": {"city": "Paris", "days": 3},
            "mistral": {"city": "Paris", "days": 3}, "glm": {"city": "Paris"}, "kimi": {"city": "Paris"},
            "nemotron": {"city": "Paris"}, "minimax": {"city": "Paris"}, "deepseek": {"city": "Paris"}}
# The thought a scripted model writes before its call (Qwen3.5's, Nemotron's and MiniMax's, whose
# prompts open <think>).
THOUGHT = {"qwen3.5": "Calling_get_weather.", "nemotron": "Checking_the_weather.",
           "minimax": "Checking_the_weather_first."}
# Text a scripted model writes before its call (Gemma 4's; the others call straight away).
REMARK = {"gemma4": "Checking."}
# What a scripted model answers once the call's result is in the prompt (DeepSeek-V3.1's template
# ends that prompt with the tool's output; the others call again, which is all they can do).
AFTER_RESULT = {"deepseek": "Sunny_in_Paris."}


def scripted_server(tmp_path_factory, fmt, template, extra=()):
    model = tmp_path_factory.mktemp(f"scripted-{fmt}") / "model"
    subprocess.run([str(BINARY), "make-test-model", "--scripted", fmt, "--chat-template", str(TEMPLATES / template),
                    str(model)], check=True)
    yield from launch(tmp_path_factory, f"client-tests-{fmt}{''.join(extra)}.log", ["--model", str(model), *extra])


@pytest.fixture(scope="module", params=[("harmony", "gpt-oss.jinja"), ("qwen-xml", "qwen3-coder.jinja"),
                                        ("gemma4", "gemma4.jinja"), ("qwen3.5", "qwen3.5.jinja"),
                                        ("pythonic", "lfm2.jinja"), ("glm", "glm-4.6.jinja"), ("kimi", "kimi-k2.jinja"),
                                        ("nemotron", "nemotron-nano-v2.jinja"), ("minimax", "minimax-m2.jinja"),
                                        ("deepseek", "deepseek-v3.1.jinja")],
                ids=["harmony", "qwen-xml", "gemma4", "qwen3.5", "pythonic", "glm", "kimi", "nemotron", "minimax",
                     "deepseek"])
def scripted(request, tmp_path_factory):
    fmt, template = request.param
    for server in scripted_server(tmp_path_factory, fmt, template):
        yield fmt, server


def test_openai_chat_tool_call(scripted):
    fmt, server = scripted
    client = openai.OpenAI(base_url=server["url"], api_key="x")
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(model=server["model"], messages=messages, tools=[WEATHER])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and (choice.message.content or "") == REMARK.get(fmt, "")
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == EXPECTED[fmt]
    assert (choice.message.model_extra or {}).get("reasoning_content") == THOUGHT.get(fmt)
    # Streamed: the SDK assembles the call from its deltas.
    stream = client.chat.completions.create(model=server["model"], messages=messages, tools=[WEATHER], stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices and c.choices[0].delta.tool_calls]
    assert deltas[0].tool_calls[0].function.name == "get_weather"
    arguments = "".join(d.tool_calls[0].function.arguments or "" for d in deltas)
    assert json.loads(arguments) == EXPECTED[fmt] and not any((d.content or "").strip() for d in deltas)
    # No marker of the format leaks into the streamed text.
    streamed = client.chat.completions.create(model=server["model"], messages=messages, tools=[WEATHER], stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == REMARK.get(fmt, "")
    # The call and its result sent back render in the family's template; the scripted model
    # answers what it answers after a result.
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "sunny, 24 C"}]
    again = client.chat.completions.create(model=server["model"], messages=messages, tools=[WEATHER])
    if fmt in AFTER_RESULT:
        assert again.choices[0].message.content == AFTER_RESULT[fmt] and not again.choices[0].message.tool_calls
    else:
        assert again.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_anthropic_tool_use(scripted):
    fmt, server = scripted
    client = anthropic.Anthropic(base_url=server["base"], api_key="x")
    m = client.messages.create(model=server["model"], max_tokens=100, tools=[ANTHROPIC_WEATHER],
                               messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    assert m.stop_reason == "tool_use"
    use = next(b for b in m.content if b.type == "tool_use")
    assert use.name == "get_weather" and use.input == EXPECTED[fmt]
    with client.messages.stream(model=server["model"], max_tokens=100, tools=[ANTHROPIC_WEATHER],
                                messages=[{"role": "user", "content": "And in Oslo?"}]) as s:
        final = s.get_final_message()
    assert [b.input for b in final.content if b.type == "tool_use"] == [EXPECTED[fmt]]


def test_responses_function_call(scripted):
    fmt, server = scripted
    client = openai.OpenAI(base_url=server["url"], api_key="x")
    tool = {"type": "function", **WEATHER["function"]}
    r = client.responses.create(model=server["model"], input="What is the weather in Paris?", tools=[tool])
    calls = [item for item in r.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and json.loads(calls[0].arguments) == EXPECTED[fmt]


# Forced calls (`tool_choice` required or named) are written in the model's own format where the
# server has its grammar (Qwen's XML, Mistral's `[TOOL_CALLS]` list, GLM's tags, Kimi's and DeepSeek's sections here), and with `--strict-tools`
# so is a call the model opens by itself: the scripted call passes through the grammar unchanged,
# and comes back as the same call, whole or streamed.
@pytest.fixture(scope="module", params=[("qwen-xml", "qwen3-coder.jinja"), ("mistral", "mistral-v0.3.jinja"),
                                        ("glm", "glm-4.6.jinja"), ("kimi", "kimi-k2.jinja"),
                                        ("deepseek", "deepseek-v3.1.jinja")],
                ids=["qwen-xml", "mistral", "glm", "kimi", "deepseek"])
def strict(request, tmp_path_factory):
    fmt, template = request.param
    for server in scripted_server(tmp_path_factory, fmt, template, ["--strict-tools"]):
        yield fmt, server


@pytest.mark.parametrize("choice", ["auto", "required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["auto", "required", "named"])
def test_forced_call_in_the_models_own_format(strict, choice):
    fmt, server = strict
    client = openai.OpenAI(base_url=server["url"], api_key="x")
    ask = dict(model=server["model"], messages=[{"role": "user", "content": "What is the weather in Paris?"}],
               tools=[WEATHER], tool_choice=choice, max_tokens=120)
    r = client.chat.completions.create(**ask)
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == EXPECTED[fmt]
    assert r.choices[0].finish_reason == ("stop" if isinstance(choice, dict) else "tool_calls")
    deltas = [tc for c in client.chat.completions.create(**ask, stream=True) if c.choices
              for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "get_weather"
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == EXPECTED[fmt]
