"""The official `ollama` Python package against a running `fastmlx serve` (SmolLM2), on the
second port `--ollama-port` opens (the router tests cover the main port): list, show, ps, chat and generate (streaming and not), raw and suffix,
format, tools in the conversation, keep_alive, and errors as the package's own exception."""

import json

import ollama
import pytest


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server["ollama"])


def test_both_ports_answer_as_ollama(server):
    import urllib.request
    for base in (server["ollama"], server["base"]):
        assert urllib.request.urlopen(base + "/").read() == b"Ollama is running"


def test_list_show_and_ps(client, server):
    models = client.list().models
    assert [m.model for m in models] == [server["model"]]
    m = models[0]
    assert m.size > 50_000_000 and len(m.digest) == 64 and m.modified_at is not None
    assert (m.details.format, m.details.family, m.details.quantization_level) == ("gguf", "llama", "Q4_1")
    assert m.details.parameter_size.endswith("M")

    show = client.show(server["model"])
    assert "completion" in show.capabilities
    assert show.modelinfo["general.architecture"] == "llama"
    assert show.modelinfo["llama.context_length"] > 0
    assert "<|im_start|>" in show.template

    running = client.ps().models
    assert running[0].model == server["model"] and running[0].size_vram > 0 and running[0].expires_at is not None


def test_chat_streaming_and_not(client, server):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    options = {"temperature": 0, "num_predict": 20}
    whole = client.chat(model=server["model"], messages=messages, options=options, stream=False)
    assert "Paris" in whole.message.content
    assert whole.done and whole.done_reason == "stop"
    assert whole.prompt_eval_count > 0 and whole.eval_count > 0 and whole.eval_duration > 0 and whole.total_duration > 0
    parts = list(client.chat(model=server["model"], messages=messages, options=options, stream=True))
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert parts[-1].eval_count == whole.eval_count


def test_generate_templated_raw_and_suffix(client, server):
    r = client.generate(model=server["model"], prompt="The capital of France is", options={"temperature": 0, "num_predict": 12})
    assert r.response and r.done
    raw = client.generate(model=server["model"], prompt="<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n", raw=True,
                          options={"temperature": 0, "num_predict": 8})
    assert raw.response and raw.prompt_eval_count >= 8
    # SmolLM2's vocabulary has no fill-in-the-middle tokens: a suffix is Ollama's own "does not
    # support insert" error, and `show` does not list the capability.
    assert "insert" not in client.show(server["model"]).capabilities
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model=server["model"], prompt="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))\n")
    assert e.value.status_code == 400 and "does not support insert" in e.value.error


def test_format_json_and_schema(client, server):
    r = client.chat(model=server["model"], messages=[{"role": "user", "content": "Give a JSON object with a name."}],
                    format="json", options={"num_predict": 400, "temperature": 0})
    assert r.done_reason == "stop" and isinstance(json.loads(r.message.content), dict)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "country": {"type": "string", "maxLength": 20}},
              "required": ["city", "country"]}
    r = client.chat(model=server["model"], messages=[{"role": "user", "content": "Paris is in which country?"}], format=schema,
                    options={"num_predict": 80, "temperature": 0})
    answer = json.loads(r.message.content)
    assert set(answer) == {"city", "country"}


def test_tools_in_the_conversation(client, server):
    # SmolLM2's template has no tools: the call and its result are shown to the model as text,
    # and the answer continues from them.
    def get_weather(city: str) -> str:
        """Get the weather in a city.

        Args:
          city: The city
        """
        return "sunny"

    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny, 24 C", "tool_name": "get_weather"},
    ]
    r = client.chat(model=server["model"], messages=messages, tools=[get_weather], options={"temperature": 0, "num_predict": 24})
    assert r.message.content and r.done


def test_keep_alive_load_and_errors(client, server):
    loaded = client.generate(model=server["model"], prompt="", keep_alive="10m")
    assert loaded.done_reason == "load"
    expires = client.ps().models[0].expires_at
    assert expires is not None
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="llama3.2:3b", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 404 and "not found" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=server["model"], messages=[{"role": "user", "content": "hi"}], options={"temperature": "hot"})
    assert e.value.status_code == 400 and "temperature" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("llama3.2")
    assert e.value.status_code == 400 and "Hugging Face" in e.value.error
