"""The official `openai` Python package against a running `fastmlx serve` (SmolLM2)."""

import concurrent.futures
import time
import urllib.request

import openai
import pytest


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server["url"], api_key="any", max_retries=0)


def ask(client, model, content, **kw):
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], temperature=0, **kw
    )


def test_models(client, server):
    ids = [m.id for m in client.models.list()]
    assert ids == [server["model"]]
    assert client.models.retrieve(server["model"]).id == server["model"]


def test_chat_non_streaming(client, server):
    r = ask(client, server["model"], "What is the capital of France?", max_tokens=20)
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    u = r.usage
    assert u.prompt_tokens > 0 and u.completion_tokens > 0 and u.total_tokens == u.prompt_tokens + u.completion_tokens


def test_chat_streaming_with_usage_equals_non_streaming(client, server):
    whole = ask(client, server["model"], "Name three colors.", max_tokens=24).choices[0].message.content
    chunks = list(ask(client, server["model"], "Name three colors.", max_tokens=24, stream=True,
                      stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert [c for c in chunks if c.choices][-1].choices[0].finish_reason in ("stop", "length")


def test_logprobs(client, server):
    r = ask(client, server["model"], "Hi", max_tokens=4, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in content)
    # greedy: the chosen token is the most likely one
    assert all(t.top_logprobs[0].token == t.token for t in content)


def test_text_completion(client, server):
    r = client.completions.create(model=server["model"], prompt="def fibonacci(n):", max_tokens=16, temperature=0)
    assert r.choices[0].text.strip()
    assert r.usage.completion_tokens == 16 or r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=server["model"], prompt="def fibonacci(n):", max_tokens=16, temperature=0, stream=True) if c.choices)
    assert streamed == r.choices[0].text


def test_stop_and_seed(client, server):
    r = ask(client, server["model"], "What is the capital of France?", max_tokens=20, stop=["France", "xyz"])
    assert "France" not in r.choices[0].message.content and r.choices[0].finish_reason == "stop"
    kw = dict(temperature=0.9, seed=42, max_tokens=16)
    a = client.chat.completions.create(model=server["model"], messages=[{"role": "user", "content": "Tell me a story"}], **kw)
    b = client.chat.completions.create(model=server["model"], messages=[{"role": "user", "content": "Tell me a story"}], **kw)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_errors_are_the_sdks_own_exceptions(client, server):
    with pytest.raises(openai.NotFoundError):
        ask(client, "no-such-model", "hi")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=server["model"], messages=[])
    assert e.value.body["param"] == "messages"
    with pytest.raises(openai.BadRequestError):
        ask(client, server["model"], "hi", n=3)
    keyed = openai.OpenAI(base_url=server["url"], api_key="any", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        keyed.chat.completions.create(model=server["model"], messages=[{"role": "user", "content": "x"}], top_p=7)


def metric(server, name):
    text = urllib.request.urlopen(server["base"] + "/metrics").read().decode()
    # One series per loaded model: `name{model="..."} value`; the tests load one.
    return float(next(l.rsplit(" ", 1)[1] for l in text.splitlines() if l.startswith(name + "{")))


def test_closing_the_stream_cancels(client, server):
    before = metric(server, "fastmlx_requests_cancelled_total")
    stream = ask(client, server["model"], "Write a very long essay about the sea.", max_tokens=2000, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    deadline = time.time() + 10
    while metric(server, "fastmlx_requests_cancelled_total") < before + 1:
        assert time.time() < deadline, "the closed stream was not cancelled"
        time.sleep(0.05)
    assert metric(server, "fastmlx_running_requests") == 0


def test_sixteen_concurrent_streams_are_independent(client, server):
    prompts = [f"Write one sentence about the number {i}." for i in range(16)]
    alone = {p: ask(client, server["model"], p, max_tokens=24).choices[0].message.content for p in prompts[:4]}

    def stream(p):
        return "".join(c.choices[0].delta.content or "" for c in ask(client, server["model"], p, max_tokens=24, stream=True) if c.choices)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = dict(zip(prompts, pool.map(stream, prompts)))
    assert all(results[p] for p in prompts)
    for p, text in alone.items():
        assert results[p] == text, f"{p!r} differs under load"
