#!/usr/bin/env python3
"""Generate reference chat-template renders with Hugging Face transformers.

This script reads the verbatim chat templates in ``tests/data/chat_templates/*.jinja``
(see ``tests/data/chat_templates/SOURCES.md`` for where each one came from) and renders
a fixed set of conversations through transformers' own ``apply_chat_template``. It then
writes the inputs and the expected output (or the expected error) of every case to
``tests/data/chat_templates/cases.json``. Our Rust (minijinja) renderer is tested
against that file.

How to regenerate
-----------------
It needs ``transformers`` and ``jinja2``. It does not need torch, and it does not use
the network (the tokenizer is built in code):

    python3 -m venv /tmp/tmpl-venv
    /tmp/tmpl-venv/bin/pip install transformers jinja2
    /tmp/tmpl-venv/bin/python scripts/reference/chat_templates.py

Run it from any directory. Paths are resolved relative to this file. Pass ``--check`` to
re-render every case and compare it with the existing cases.json without writing it.
The command exits non-zero if anything differs.

How a case is rendered (this is what the Rust side must reproduce)
------------------------------------------------------------------
``tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=...,
tokenize=False, **extra)`` on a ``PreTrainedTokenizerFast`` (``TokenizersBackend`` in
transformers 5) built with the model's bos_token/eos_token. transformers then:

* drops every message key whose value is ``None`` (``_normalize_chat_messages``), for
  example ``"content": null`` on an assistant tool-call message;
* copies ``reasoning_content`` / ``thinking`` / ``reasoning`` onto each other (in 5.x);
* renders with the template variables ``messages``, ``tools`` (``None`` when no tools
  are given, so ``tools is defined`` is true), ``documents`` (``None``),
  ``add_generation_prompt``, every named special token that is set (here only
  ``bos_token``/``eos_token``; a ``null`` token in cases.json is *not passed at all*),
  and the ``extra`` kwargs (date_string, enable_thinking, ...).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import jinja2
import transformers
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT / "tests" / "data" / "chat_templates"
OUT_FILE = DATA_DIR / "cases.json"

# Special tokens as set in each model's tokenizer_config.json (see SOURCES.md).
TEMPLATES = {
    "llama3.1.jinja": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "tools": True},
    "llama3.2.jinja": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "tools": True,
                       # The template calls strftime_now("%d %b %Y") when date_string is not passed.
                       "extra": {"date_string": "26 Jul 2024"}},
    "mistral-v0.3.jinja": {"bos_token": "<s>", "eos_token": "</s>", "tools": True},
    "qwen2.5.jinja": {"bos_token": None, "eos_token": "<|im_end|>", "tools": True},
    "qwen3.jinja": {"bos_token": None, "eos_token": "<|im_end|>", "tools": True},
    "phi3.5.jinja": {"bos_token": "<s>", "eos_token": "<|endoftext|>", "tools": False},
    "smollm2.jinja": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "tools": False},
    # gpt-oss writes today's date (strftime_now) into its system message: the Rust test reads
    # "Current date: YYYY-MM-DD" as any date.
    "gpt-oss.jinja": {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "tools": True},
    "qwen3-coder.jinja": {"bos_token": None, "eos_token": "<|im_end|>", "tools": True},
    "gemma3.jinja": {"bos_token": "<bos>", "eos_token": "<end_of_turn>", "tools": False},
    "gemma4.jinja": {"bos_token": "<bos>", "eos_token": "<turn|>", "tools": True},
    # The linear-attention hybrids: Qwen3.5 / 3.6 (XML tool calls, thinking on by default),
    # Qwen3-Next (Hermes JSON calls), LFM2 (Python-list calls, tools as a JSON list).
    "qwen3.5.jinja": {"bos_token": None, "eos_token": "<|im_end|>", "tools": True},
    "qwen3.6.jinja": {"bos_token": None, "eos_token": "<|im_end|>", "tools": True},
    "qwen3-next-instruct.jinja": {"bos_token": None, "eos_token": "<|im_end|>", "tools": True},
    "qwen3-next-thinking.jinja": {"bos_token": None, "eos_token": "<|im_end|>", "tools": True},
    "lfm2.jinja": {"bos_token": "<|startoftext|>", "eos_token": "<|im_end|>", "tools": True},
    # GLM-4.5/4.6 (key/value tag calls, `/nothink`) and MiniMax-M2 (`<minimax:tool_call>` with
    # `<invoke>`, thinking opened by the generation prompt).
    "glm-4.6.jinja": {"bos_token": None, "eos_token": "<|endoftext|>", "tools": True},
    "minimax-m2.jinja": {"bos_token": "]~!b[", "eos_token": "[e~[", "tools": True},
    # DeepSeek-V3.1 (its template renders no tools; calls between its own special tokens,
    # thinking off unless asked) and Kimi K2 (tools as a JSON list, `functions.name:index` ids).
    "deepseek-v3.1.jinja": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>", "tools": True},
    "kimi-k2.jinja": {"bos_token": "[BOS]", "eos_token": "[EOS]", "tools": True},
    # SmolLM3 (`/think` and `/no_think`, Hermes calls) and Seed-OSS (`<seed:tool_call>` calls).
    "smollm3.jinja": {"bos_token": None, "eos_token": "<|im_end|>", "tools": True},
    "seed-oss.jinja": {"bos_token": "<seed:bos>", "eos_token": "<seed:eos>", "tools": True},
    # The Mamba-2 hybrids: Nemotron Nano 2 (`<TOOLCALL>` JSON lists, `/think` and `/no_think`),
    # Nemotron 3 (ChatML, Qwen3-Coder's XML calls, thinking opened by the generation prompt) and
    # Granite 4.0 (Hermes-style calls, a default system message).
    "nemotron-nano-v2.jinja": {"bos_token": "<s>", "eos_token": "<SPECIAL_12>", "tools": True},
    "nemotron-3-nano.jinja": {"bos_token": "<s>", "eos_token": "<|im_end|>", "tools": True},
    "granite-4.0.jinja": {"bos_token": "<|end_of_text|>", "eos_token": "<|end_of_text|>", "tools": True},
}

# The description deliberately contains ' " < > & and non-ASCII, because transformers'
# tojson is plain json.dumps(ensure_ascii=False) and minijinja's built-in tojson
# HTML-escapes < > & '.
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a location. Units: 'celsius' (°C) or \"fahrenheit\" <°F> & more.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City and country, e.g. Paris, France"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}

TOOL_CALL_ID = "abc123XYZ"  # Mistral's template requires 9 alphanumeric characters.
TOOL_ARGS = {"location": "Paris, France", "unit": "celsius"}
TOOL_RESULT = '{"temperature": 22, "unit": "celsius", "condition": "sunny ☀"}'

USER_ONLY = [{"role": "user", "content": "Hello! How are you?"}]

MULTI_TURN = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "And of Germany?"},
]

COMPLETE = [
    {"role": "user", "content": "Say hi."},
    {"role": "assistant", "content": "Hi!"},
]

# An earlier answer with its reasoning apart (what the thinking families drop or keep).
HISTORY_WITH_REASONING = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "2+2 = 4.", "reasoning_content": "Simple arithmetic."},
    {"role": "user", "content": "And 3+3?"},
]

NON_ASCII = [
    {"role": "user", "content": "Grüße, 世界 🌍! Ça va? «ü» — “quotes” ‘single’ \\ backslash"},
    {"role": "assistant", "content": "Привет! 你好 👋 Ça va bien."},
    {"role": "user", "content": "Ünïcödé again: 日本語テキスト 🚀"},
]


def tool_conversation(assistant_content):
    call = {"role": "assistant", "content": assistant_content, "tool_calls": [
        {"id": TOOL_CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": TOOL_ARGS}}]}
    return [
        {"role": "user", "content": "What's the weather in Paris?"},
        call,
        {"role": "tool", "tool_call_id": TOOL_CALL_ID, "name": "get_weather", "content": TOOL_RESULT},
    ]


def with_second_call(second_args):
    """tool_conversation with a second call (to Oslo, `second_args`) and its result."""
    two = copy.deepcopy(tool_conversation(""))
    two[1]["tool_calls"].append({"id": "call_2", "type": "function",
                                 "function": {"name": "get_weather", "arguments": second_args}})
    two.append({"role": "tool", "tool_call_id": "call_2", "name": "get_weather", "content": "rain"})
    return two


def cases_for(name, meta):
    """Yield (case, messages, tools, add_generation_prompt, extra) tuples."""
    extra = dict(meta.get("extra", {}))
    yield "single_user", USER_ONLY, None, True, extra
    yield "multi_turn_system", MULTI_TURN, None, True, extra
    if meta["tools"]:
        yield "tools", tool_conversation(""), [WEATHER_TOOL], True, extra
        # OpenAI clients send content: null with tool_calls. transformers drops None-valued keys.
        yield "tools_null_content", tool_conversation(None), [WEATHER_TOOL], True, extra
        # Tools offered, no call made yet.
        yield "tools_offered", USER_ONLY, [WEATHER_TOOL], True, extra
    yield "complete_no_gen_prompt", COMPLETE, None, False, extra
    yield "non_ascii", NON_ASCII, None, True, extra

    if name == "llama3.1.jinja":
        yield "date_string_override", USER_ONLY, None, True, {"date_string": "01 Jan 2025"}
        two_calls = copy.deepcopy(tool_conversation(""))
        two_calls[1]["tool_calls"].append(copy.deepcopy(two_calls[1]["tool_calls"][0]))
        yield "error_parallel_tool_calls", two_calls, [WEATHER_TOOL], True, extra
    if name == "llama3.2.jinja":
        yield "date_string_override", USER_ONLY, None, True, {"date_string": "01 Jan 2025"}
    if name == "mistral-v0.3.jinja":
        yield "error_roles_not_alternating", [
            {"role": "user", "content": "one"}, {"role": "user", "content": "two"}], None, True, extra
        bad_id = copy.deepcopy(tool_conversation(""))
        bad_id[1]["tool_calls"][0]["id"] = "call_1"
        bad_id[2]["tool_call_id"] = "call_1"
        yield "error_bad_tool_call_id", bad_id, [WEATHER_TOOL], True, extra
    if name == "qwen2.5.jinja":
        # Arguments as a JSON *string* (raw OpenAI wire format): tojson double-encodes it.
        conv = copy.deepcopy(tool_conversation(""))
        conv[1]["tool_calls"][0]["function"]["arguments"] = json.dumps(TOOL_ARGS)
        yield "tools_arguments_string", conv, [WEATHER_TOOL], True, extra
    if name == "qwen3.jinja":
        yield "enable_thinking_false", USER_ONLY, None, True, {"enable_thinking": False}
        yield "enable_thinking_true", USER_ONLY, None, True, {"enable_thinking": True}
        yield "multi_turn_enable_thinking_false", MULTI_TURN, None, True, {"enable_thinking": False}
        history_with_think = [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "<think>\nSimple arithmetic.\n</think>\n\n2+2 = 4."},
            {"role": "user", "content": "And 3+3?"},
        ]
        yield "history_think_stripped", history_with_think, None, True, extra
        last_with_think = [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "<think>\nSimple arithmetic.\n</think>\n\n2+2 = 4."},
        ]
        yield "last_assistant_think_kept", last_with_think, None, False, extra
        with_reasoning_field = [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "2+2 = 4.", "reasoning_content": "Simple arithmetic."},
        ]
        yield "reasoning_content_field", with_reasoning_field, None, False, extra
        conv = copy.deepcopy(tool_conversation(""))
        conv[1]["tool_calls"][0]["function"]["arguments"] = json.dumps(TOOL_ARGS)
        yield "tools_arguments_string", conv, [WEATHER_TOOL], True, extra


    if name == "gpt-oss.jinja":
        yield "reasoning_effort_high", USER_ONLY, None, True, {"reasoning_effort": "high"}
        with_thinking = copy.deepcopy(tool_conversation(""))
        with_thinking[1]["thinking"] = "The user wants the weather; call the tool."
        yield "tools_with_thinking", with_thinking, [WEATHER_TOOL], True, extra
        yield "developer_instructions", [{"role": "system", "content": "Answer in French."}] + USER_ONLY, [WEATHER_TOOL], True, extra
    if name == "qwen3-coder.jinja":
        yield "two_calls_two_results", with_second_call({"location": "Oslo"}), [WEATHER_TOOL], True, extra
        # Values written with Python's str(): True, None, 2.5 (not JSON's true, null).
        typed = copy.deepcopy(tool_conversation(""))
        typed[1]["tool_calls"][0]["function"]["arguments"] = {"location": "Oslo", "days": 3, "metric": True,
                                                               "ratio": 2.5, "extra": None, "tags": ["a", "b"]}
        yield "typed_argument_values", typed, [WEATHER_TOOL], True, extra


    if name in ("qwen3.5.jinja", "qwen3.6.jinja", "qwen3-next-thinking.jinja"):
        yield "enable_thinking_false", USER_ONLY, None, True, {"enable_thinking": False}
        yield "enable_thinking_true", USER_ONLY, None, True, {"enable_thinking": True}
        yield "history_reasoning_dropped", HISTORY_WITH_REASONING, None, True, extra
        yield "two_calls_two_results", with_second_call({"location": "Oslo"}), [WEATHER_TOOL], True, extra
    if name == "nemotron-nano-v2.jinja":
        yield "no_think_in_system", [{"role": "system", "content": "Be brief. /no_think"}] + USER_ONLY, None, True, extra
    if name == "nemotron-3-nano.jinja":
        yield "enable_thinking_false", USER_ONLY, None, True, {"enable_thinking": False}
        yield "history_reasoning_truncated", HISTORY_WITH_REASONING, None, True, extra
    if name in ("nemotron-nano-v2.jinja", "nemotron-3-nano.jinja", "granite-4.0.jinja"):
        yield "two_calls_two_results", with_second_call({"location": "Oslo", "days": 3}), [WEATHER_TOOL], True, extra
    if name in ("deepseek-v3.1.jinja", "kimi-k2.jinja", "smollm3.jinja", "seed-oss.jinja"):
        yield "enable_thinking_true", USER_ONLY, None, True, {"enable_thinking": True}
        yield "two_calls_two_results", with_second_call({"location": "Oslo", "days": 3}), [WEATHER_TOOL], True, extra
    if name in ("glm-4.6.jinja", "minimax-m2.jinja"):
        yield "enable_thinking_false", USER_ONLY, None, True, {"enable_thinking": False}
        yield "multi_turn_enable_thinking_false", MULTI_TURN, None, True, {"enable_thinking": False}
        yield "history_reasoning_dropped", HISTORY_WITH_REASONING, None, True, extra
        # Reasoning after the last user turn (an agent's call, its result, the next step) is kept.
        two = with_second_call({"location": "Oslo", "days": 3, "metric": True, "tags": ["a"]})
        two[1]["reasoning_content"] = "Check the weather in both cities."
        yield "two_calls_two_results", two, [WEATHER_TOOL], True, extra
    if name == "lfm2.jinja":
        # LFM2's assistant turns carry their calls in the content, as the model wrote them.
        written = [
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": '<|tool_call_start|>[get_weather(location="Paris, France")]<|tool_call_end|>'},
            {"role": "tool", "content": TOOL_RESULT},
        ]
        yield "calls_in_content", written, [WEATHER_TOOL], True, extra
    if name == "gemma4.jinja":
        yield "enable_thinking_true", USER_ONLY, None, True, {"enable_thinking": True}
        history_with_thought = [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "<|channel>thought\nSimple arithmetic.<channel|>2+2 = 4."},
            {"role": "user", "content": "And 3+3?"},
        ]
        yield "history_thought_stripped", history_with_thought, None, True, extra
        typed = copy.deepcopy(tool_conversation(""))
        typed[1]["tool_calls"][0]["function"]["arguments"] = {"location": "Oslo", "days": 3, "metric": True,
                                                               "ratio": 2.5, "tags": ["a", "b"],
                                                               "where": {"lat": 59.9, "name": "Oslo"}}
        yield "typed_argument_values", typed, [WEATHER_TOOL], True, extra


def make_tokenizer(meta, chat_template):
    vocab = {}
    for tok in (meta["bos_token"], meta["eos_token"]):
        if tok is not None and tok not in vocab:
            vocab[tok] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab))
    kwargs = {k: meta[k] for k in ("bos_token", "eos_token") if meta[k] is not None}
    return PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=chat_template, **kwargs)


def render_all():
    out = []
    for name, meta in TEMPLATES.items():
        template = (DATA_DIR / name).read_text(encoding="utf-8")
        tok = make_tokenizer(meta, template)
        for case, messages, tools, agp, extra in cases_for(name, meta):
            messages = copy.deepcopy(messages)
            entry = {
                "template": name,
                "case": case,
                "bos_token": meta["bos_token"],
                "eos_token": meta["eos_token"],
                "add_generation_prompt": agp,
                "extra": extra,
                "messages": messages,
                "tools": tools,
                "expected": None,
                "expected_error_contains": None,
                # "raise_exception": the template called raise_exception(msg); the message is the template's
                # own text, so match it. "undefined": jinja2 failed on an undefined value; its wording is
                # jinja2's, so expected_error_contains is "" and the exact text is kept in "jinja2_error".
                "expected_error_kind": None,
                "jinja2_error": None,
                "transformers_version": transformers.__version__,
                "jinja2_version": jinja2.__version__,
            }
            try:
                entry["expected"] = tok.apply_chat_template(
                    copy.deepcopy(messages), tools=copy.deepcopy(tools), add_generation_prompt=agp,
                    tokenize=False, **extra)
            except (jinja2.exceptions.UndefinedError, TypeError) as e:
                # TypeError: an undefined value reached tojson (json.dumps cannot write it).
                entry["expected_error_kind"] = "undefined"
                entry["expected_error_contains"] = ""
                entry["jinja2_error"] = f"{type(e).__name__}: {e}"
            except jinja2.exceptions.TemplateError as e:  # raise_exception() raises a bare TemplateError
                entry["expected_error_kind"] = "raise_exception"
                entry["expected_error_contains"] = str(e)
                entry["jinja2_error"] = f"{type(e).__name__}: {e}"
            out.append(entry)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with existing cases.json, do not write")
    args = ap.parse_args()
    cases = render_all()
    text = json.dumps(cases, ensure_ascii=False, indent=1) + "\n"
    if args.check:
        old = OUT_FILE.read_text(encoding="utf-8")
        if old != text:
            print("cases.json differs from a fresh render", file=sys.stderr)
            sys.exit(1)
        print(f"OK: {len(cases)} cases match")
        return
    OUT_FILE.write_text(text, encoding="utf-8")
    n_err = sum(1 for c in cases if c["expected_error_contains"] is not None)
    print(f"wrote {OUT_FILE} ({len(cases)} cases, {n_err} expected errors, transformers {transformers.__version__})")


if __name__ == "__main__":
    main()
