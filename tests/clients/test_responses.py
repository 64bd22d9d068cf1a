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


def test_stored_state_is_a_clear_error(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=server["model"], input="hi", previous_response_id="resp_123")
    assert "not supported" in e.value.message
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_123")
