"""The official `anthropic` Python package against a running `fastmlx serve` (SmolLM2), as
Claude Code uses it: `claude-*` ids go to the served model; messages streaming and not, a tool
round trip, count_tokens, and errors as the package's own exceptions."""

import anthropic
import pytest


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server["base"], api_key="any", max_retries=0)


WEATHER = {
    "name": "get_weather",
    "description": "Get the weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]},
}


# This SDK no longer has sampling parameters; older clients send `temperature`, which the
# server honours: greedy answers are compared here.
GREEDY = {"temperature": 0}


def test_message_and_stream(client):
    kw = dict(model="claude-sonnet-5-5", max_tokens=20, extra_body=GREEDY, system="You are a helpful assistant.",
              messages=[{"role": "user", "content": "What is the capital of France?"}])
    m = client.messages.create(**kw)
    assert m.type == "message" and m.role == "assistant" and m.model == "claude-sonnet-5-5"
    assert "Paris" in m.content[0].text
    assert m.stop_reason == "end_turn" and m.usage.input_tokens > 0 and m.usage.output_tokens > 0
    with client.messages.stream(**kw) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == m.content[0].text
    assert final.usage.output_tokens == m.usage.output_tokens and final.stop_reason == "end_turn"


def test_stop_sequences_and_max_tokens(client):
    # Greedy: sampled at the default temperature 1, the model may end its turn within 3 tokens.
    m = client.messages.create(model="claude-x", max_tokens=3, extra_body=GREEDY,
                               messages=[{"role": "user", "content": "Count to ten."}])
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3


def test_tool_round_trip(client):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = client.messages.create(model="claude-x", max_tokens=100, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"},
                               messages=messages, extra_body=GREEDY)
    call = next(b for b in m.content if b.type == "tool_use")
    assert call.name == "get_weather" and isinstance(call.input["city"], str) and call.id.startswith("toolu_")
    # Streamed: the input arrives as input_json_delta and the SDK assembles it. Greedy and one call:
    # sampled at random, a random model may write calls until max_tokens cuts the list short.
    choice = {"type": "any", "disable_parallel_tool_use": True}
    with client.messages.stream(model="claude-x", max_tokens=100, tools=[WEATHER], tool_choice=choice, messages=messages, extra_body=GREEDY) as s:
        final = s.get_final_message()
    assert any(b.type == "tool_use" and b.name == "get_weather" for b in final.content)
    messages += [
        {"role": "assistant", "content": m.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 24 C"}]},
    ]
    answer = client.messages.create(model="claude-x", max_tokens=30, tools=[WEATHER], messages=messages, extra_body=GREEDY)
    assert answer.content and answer.content[0].type == "text" and answer.content[0].text


def test_structured_output(client):
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}}, "required": ["capital"]}
    m = client.messages.create(model="claude-x", max_tokens=60, extra_body=GREEDY, output_config={"format": {"type": "json_schema", "schema": schema}},
                               messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}])
    assert set(__import__("json").loads(m.content[0].text)) == {"capital"}


def test_count_tokens(client):
    kw = dict(model="claude-x", messages=[{"role": "user", "content": "Hello there"}], system="Be brief.")
    counted = client.messages.count_tokens(**kw).input_tokens
    m = client.messages.create(max_tokens=1, **kw)
    # The prompt: what was processed anew plus what came from the prefix cache.
    assert counted == m.usage.input_tokens + m.usage.cache_read_input_tokens


def test_errors_are_the_sdks_own(client, server):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="claude-x", max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])
    assert e.value.body["error"]["type"] == "invalid_request_error" and "image" in e.value.message
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    keyed = anthropic.Anthropic(base_url=server["base"], api_key="wrong", max_retries=0)
    keyed.messages.create(model="claude-x", max_tokens=1, messages=[{"role": "user", "content": "hi"}])  # no key set: any is accepted
