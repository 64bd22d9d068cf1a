"""The official `openai` package's Responses API (what Codex CLI speaks) against a running
`fastmlx serve` (SmolLM2): text streaming and not, a function-call round trip, and the clear
errors for stored state."""

import json

import openai
import pytest


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server["url"], api_key="any", max_retries=0)


TOOLS = [{
    "type": "function", "name": "get_weather", "description": "Get the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]},
}]


def test_text_streaming_and_not(client, server):
    kw = dict(model=server["model"], instructions="You are a helpful assistant.", input="What is the capital of France?",
              max_output_tokens=20, temperature=0, store=False)
    r = client.responses.create(**kw)
    assert r.status == "completed" and "Paris" in r.output_text
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    events = list(client.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert events[-1].response.output_text == r.output_text


def test_function_call_round_trip(client, server):
    r = client.responses.create(model=server["model"], input="What is the weather in Paris?", tools=TOOLS,
                                tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=60)
    call = next(item for item in r.output if item.type == "function_call")
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)
    streamed = list(client.responses.create(model=server["model"], input="Weather in Oslo?", tools=TOOLS, tool_choice="required",
                                            parallel_tool_calls=False, max_output_tokens=100, stream=True))
    done = [e for e in streamed if e.type == "response.function_call_arguments.done"]
    assert done and isinstance(json.loads(done[0].arguments), dict)
    follow = client.responses.create(model=server["model"], tools=TOOLS, max_output_tokens=30, temperature=0, input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24 C"},
    ])
    assert follow.output_text


def test_custom_tool_round_trip(client, server):
    """A custom (freeform) tool, as Codex's `apply_patch` is: a forced call comes back as a
    `custom_tool_call` whose input a `regex` format holds; streamed, its input arrives in the
    custom-tool events; the call and its output go back as input items."""
    import re
    code = {"type": "custom", "name": "ticket", "description": "Open a ticket by its code.",
            "format": {"type": "grammar", "syntax": "regex", "definition": "[A-Z]{3}-[0-9]{2}"}}
    patch = {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch.",
             "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" /(.|\\n)*/ "*** End Patch"'}}
    kw = dict(model=server["model"], input="Open a ticket for the broken login.", tools=[code, patch],
              tool_choice={"type": "custom", "name": "ticket"}, max_output_tokens=40, temperature=0)
    r = client.responses.create(**kw)
    call = r.output[-1]
    assert call.type == "custom_tool_call" and call.name == "ticket", r.output
    assert re.fullmatch("[A-Z]{3}-[0-9]{2}", call.input), call.input
    events = list(client.responses.create(stream=True, **kw))
    done = next(e for e in events if e.type == "response.custom_tool_call_input.done")
    assert done.input == call.input
    assert events[-1].response.output[-1].input == call.input
    followed = client.responses.create(model=server["model"], tools=[code, patch], max_output_tokens=20, temperature=0, input=[
        {"role": "user", "content": "Open a ticket for the broken login."},
        {"type": "custom_tool_call", "call_id": call.call_id, "name": "ticket", "input": call.input},
        {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Ticket opened."},
    ])
    assert followed.status in ("completed", "incomplete") and followed.output


def test_stored_state_is_a_clear_error(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=server["model"], input="hi", previous_response_id="resp_123")
    assert "not supported" in e.value.message
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_123")
