"""Where a request's time went, through the official openai package: the `Server-Timing` header
of a whole answer, and llama.cpp-style `timings` on the answer and on the last streamed chunk."""

import openai


def test_server_timing_header_and_timings(server):
    client = openai.OpenAI(base_url=server["url"], api_key="none", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=server["model"], max_tokens=6, temperature=0, messages=[{"role": "user", "content": "Say hi."}]
    )
    timing = raw.headers["server-timing"]
    for part in ("queue;dur=", "restore;dur=", "prefill;dur=", "ttft;dur=", "decode;dur="):
        assert part in timing, timing
    completion = raw.parse()
    timings = completion.model_extra["timings"]
    assert timings["predicted_n"] == completion.usage.completion_tokens
    assert timings["prompt_n"] + timings["cache_n"] == completion.usage.prompt_tokens
    assert timings["ttft_ms"] > 0


def test_the_last_streamed_chunk_has_the_timings(server):
    client = openai.OpenAI(base_url=server["url"], api_key="none", max_retries=0)
    chunks = list(client.chat.completions.create(
        model=server["model"], max_tokens=6, temperature=0, stream=True, messages=[{"role": "user", "content": "Say hi."}]
    ))
    with_timings = [c for c in chunks if (c.model_extra or {}).get("timings")]
    assert len(with_timings) == 1
    assert with_timings[0].choices[0].finish_reason in ("stop", "length")
    assert with_timings[0].model_extra["timings"]["predicted_n"] >= 1
