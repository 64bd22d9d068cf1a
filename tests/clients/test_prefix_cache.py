"""The prefix cache as agents' clients see it, through the official packages: a second request
that shares a long system prompt reports the reused tokens where each client looks
(`usage.prompt_tokens_details.cached_tokens`, `usage.cache_read_input_tokens`,
`usage.input_tokens_details.cached_tokens`, a smaller `prompt_eval_count`), with the same answer."""

import anthropic
import ollama
import openai

SYSTEM = (
    "You are a coding assistant inside an IDE. Answer briefly. Use the tools when asked. "
    + "Project rules: keep functions small, name things for what they are, write tests first. " * 8
)


def test_openai_chat_reports_cached_tokens_and_answers_the_same(server):
    client = openai.OpenAI(base_url=server["url"], api_key="none", max_retries=0)
    ask = lambda q: client.chat.completions.create(
        model=server["model"], max_tokens=12, temperature=0,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
    )
    first = ask("What does a linter do?")
    second = ask("What does a linter do?")
    assert first.usage.prompt_tokens > 150
    assert second.usage.prompt_tokens_details.cached_tokens >= second.usage.prompt_tokens - 64
    assert second.choices[0].message.content == first.choices[0].message.content, "a hit answers like a cold prefill"
    other = ask("And a formatter?")
    assert other.usage.prompt_tokens_details.cached_tokens >= 128, "the shared system prompt"


def test_responses_report_cached_input(server):
    client = openai.OpenAI(base_url=server["url"], api_key="none", max_retries=0)
    for _ in range(2):
        r = client.responses.create(model=server["model"], instructions=SYSTEM, input="Name one sorting algorithm.", max_output_tokens=8)
    assert r.usage.input_tokens_details.cached_tokens >= 128


def test_anthropic_reports_cache_reads(server):
    client = anthropic.Anthropic(base_url=server["base"], api_key="any", max_retries=0)
    for _ in range(2):
        m = client.messages.create(model="claude-sonnet-5-5", max_tokens=8, system=SYSTEM,
                                   messages=[{"role": "user", "content": "Name one design pattern."}])
    assert m.usage.cache_read_input_tokens >= 128
    assert m.usage.cache_creation_input_tokens == 0
    assert m.usage.input_tokens < 64, "only the tokens processed anew"


def test_ollama_counts_only_evaluated_prompt_tokens(server):
    client = ollama.Client(host=server["ollama"])
    ask = lambda: client.chat(model=server["model"], stream=False, options={"num_predict": 8, "temperature": 0},
                              messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name one data structure."}])
    first, second = ask(), ask()
    assert second.prompt_eval_count < first.prompt_eval_count / 4, (first.prompt_eval_count, second.prompt_eval_count)
    assert second.message.content == first.message.content
