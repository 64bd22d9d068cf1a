"""docs/openapi.json (generated from the Rust types) is a valid OpenAPI 3.1 document, and what the
running server answers validates against it: chat and text completions, stream chunks, models,
health and errors."""

import json
from pathlib import Path

import jsonschema
import pytest
import urllib.error
import urllib.request
from openapi_spec_validator import validate

DOC = json.loads((Path(__file__).resolve().parents[2] / "docs/openapi.json").read_text())


def check(name, value):
    schema = {"$ref": f"#/components/schemas/{name}", "components": DOC["components"]}
    jsonschema.Draft202012Validator(schema).validate(value)


def call(server, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server["base"] + path, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def events(text):
    return [json.loads(l[6:]) for l in text.splitlines() if l.startswith("data: ") and l != "data: [DONE]"]


def test_the_document_is_valid_openapi():
    validate(DOC)
    assert set(DOC["paths"]) >= {"/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/{id}", "/health", "/metrics"}


def test_chat_answers_match_the_schemas(server):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    status, text = call(server, "/v1/chat/completions", body)
    assert status == 200
    check("ChatCompletion", json.loads(text))
    status, text = call(server, "/v1/chat/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    chunks = events(text)
    assert status == 200 and len(chunks) > 2
    for chunk in chunks:
        check("ChatCompletionChunk", chunk)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}]
    status, text = call(server, "/v1/chat/completions", {**body, "tools": tools, "tool_choice": "required", "max_tokens": 80})
    answer = json.loads(text)
    assert answer["choices"][0]["message"]["tool_calls"]
    check("ChatCompletion", answer)
    for chunk in events(call(server, "/v1/chat/completions", {**body, "tools": tools, "tool_choice": "required", "max_tokens": 80, "stream": True})[1]):
        check("ChatCompletionChunk", chunk)


def test_completions_models_health_and_errors_match(server):
    status, text = call(server, "/v1/completions", {"prompt": "Once", "max_tokens": 4, "logprobs": 2})
    check("Completion", json.loads(text))
    for chunk in events(call(server, "/v1/completions", {"prompt": "Once", "max_tokens": 4, "stream": True})[1]):
        check("Completion", chunk)
    check("ModelList", json.loads(call(server, "/v1/models")[1]))
    check("Model", json.loads(call(server, "/v1/models/" + server["model"])[1]))
    check("Health", json.loads(call(server, "/health")[1]))
    for path, body, code in [("/v1/models/nope", None, 404), ("/v1/chat/completions", {"messages": []}, 400),
                             ("/v1/completions", {"prompt": "x", "top_p": 9}, 400)]:
        status, text = call(server, path, body)
        assert status == code
        check("ErrorBody", json.loads(text))
