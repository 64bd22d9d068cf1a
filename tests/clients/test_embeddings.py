"""Embeddings and reranking through the official clients against a running `fastmlx serve`
with SmolLM2 (chat), all-MiniLM-L6-v2 (embeddings) and a tiny reranker beside it: the `openai`
package's `embeddings.create` (float, and base64, its default), token-id inputs, the `ollama`
package's `embed` (normalised, truncated by default) and `embeddings`, `/v1/rerank` ordered as
the reference orders it, and bad inputs answered as each API's 4xx while the server keeps serving.
The reference vectors and scores: tests/data/reference/embeddings.json (mlx-embeddings)."""

import json
import math
import subprocess
import urllib.error
import urllib.request

import ollama
import openai
import pytest

from conftest import BINARY, ROOT, launch

REFERENCE = json.loads((ROOT / "tests/data/reference/embeddings.json").read_text())
DECODER = next(c for c in REFERENCE["decoders"] if c["variant"] == "qwen3-embedding")
MINILM = "all-MiniLM-L6-v2"
RERANKER = "tiny-reranker"
# Decoders as encoders: a tiny Qwen3-Embedding and a tiny Qwen3-Reranker (its folder says so).
QWEN3_EMBEDDING = "tiny-qwen3-embedding"
JUDGE = "tiny-qwen3-reranker"


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    minilm = ROOT / ".cache/models" / MINILM
    assert minilm.is_dir(), f"{minilm} is missing: run scripts/setup.sh --test"
    (models / MINILM).symlink_to(minilm)
    case = REFERENCE["rerank"][0]
    assert case["variant"] == "bert-reranker"
    subprocess.run([BINARY, "make-test-model", "--encoder", case["variant"], "--seed", str(case["seed"]),
                    models / RERANKER], check=True, capture_output=True)
    for name, folder, seed in [("qwen3-embedding", QWEN3_EMBEDDING, DECODER["seed"]),
                               ("qwen3-reranker", JUDGE, REFERENCE["judge"]["seed"])]:
        subprocess.run([BINARY, "make-test-model", "--encoder", name, "--seed", str(seed), models / folder],
                       check=True, capture_output=True)
    yield from launch(tmp_path_factory, "client-tests-embeddings.log", [], models=models)


@pytest.fixture(scope="module")
def client(embed_server):
    return openai.OpenAI(base_url=embed_server["url"], api_key="unused", max_retries=0)


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def assert_same(got, want, what):
    assert len(got) == len(want), what
    assert cosine(got, want) >= 0.9999, f"{what}: cosine {cosine(got, want)}"


def post(server, path, body):
    req = urllib.request.Request(server["base"] + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


TEXTS = REFERENCE["minilm"]["texts"]
VECTORS = REFERENCE["minilm"]["vectors"]
IDS = REFERENCE["minilm"]["ids"]
# Every text but the long one, which OpenAI's API refuses rather than cuts.
SHORT = [i for i, ids in enumerate(IDS) if len(ids) < REFERENCE["minilm"]["max_seq_length"]]


def test_openai_float_and_base64_equal_the_reference(client):
    texts = [TEXTS[i] for i in SHORT]
    answer = client.embeddings.create(model=MINILM, input=texts, encoding_format="float")
    assert answer.model == MINILM and [d.index for d in answer.data] == list(range(len(texts)))
    for d, i in zip(answer.data, SHORT):
        assert_same(d.embedding, VECTORS[i], f"float, text {i}")
    assert answer.usage.prompt_tokens == sum(len(IDS[i]) for i in SHORT)
    # The SDK's default: base64, decoded by the SDK.
    one = client.embeddings.create(model=MINILM, input=TEXTS[0])
    assert_same(one.data[0].embedding, VECTORS[0], "base64")
    # Token ids (as LangChain sends them) are the model's own tokens.
    by_ids = client.embeddings.create(model=MINILM, input=[IDS[0], IDS[2]], encoding_format="float")
    assert_same(by_ids.data[0].embedding, VECTORS[0], "token ids")
    assert_same(by_ids.data[1].embedding, VECTORS[2], "token ids")
    # Its own full size is accepted.
    assert len(client.embeddings.create(model=MINILM, input="x", dimensions=384).data[0].embedding) == 384


def test_openai_refuses_what_it_cannot_do_and_the_server_serves_on(client, embed_server):
    bad = [
        ({"input": []}, 400, "input"),
        ({"input": [1.5, 2]}, 400, "input"),
        ({"input": [{"text": "a"}]}, 400, "input"),
        ({"input": ["a", 3]}, 400, "input"),
        ({"input": [[]]}, 400, "input"),
        ({"input": [[999999]]}, 400, "input"),
        ({"input": ["x"] * 2049}, 400, "input"),
        ({"input": TEXTS[1]}, 400, "input"),  # longer than 256 tokens, no truncation asked
        ({"input": "x", "dimensions": 1000}, 400, "dimensions"),
        ({"input": "x", "dimensions": 100}, 400, "dimensions"),  # not trained for shorter vectors
        ({"input": "x", "dimensions": 0}, 400, "dimensions"),
        ({"input": "x", "encoding_format": "hex"}, 400, "encoding_format"),
        ({"input": "x", "model": "nope"}, 404, "model"),
        ({"input": "x", "model": embed_server["model"]}, 400, "model"),  # a chat model
        ({"input": "x", "model": RERANKER}, 400, "model"),
    ]
    for body, status, param in bad:
        body = {"model": MINILM, **body}
        got, answer = post(embed_server, "/v1/embeddings", body)
        assert (got, answer["error"]["param"]) == (status, param), f"{str(body)[:80]}: {got} {answer}"
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=MINILM, input=[])
    # An embedding model named for chat: a clean 400.
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MINILM, messages=[{"role": "user", "content": "hi"}])
    # Truncation on request, as the reference cuts at 256 tokens.
    long = client.embeddings.create(model=MINILM, input=TEXTS[1], encoding_format="float", extra_body={"truncate": True})
    assert_same(long.data[0].embedding, VECTORS[1], "long text, cut")
    assert long.usage.prompt_tokens == 256
    again = client.embeddings.create(model=MINILM, input=TEXTS[0], encoding_format="float")
    assert_same(again.data[0].embedding, VECTORS[0], "after the bad requests")


def test_models_list_the_kinds(embed_server):
    with urllib.request.urlopen(embed_server["url"] + "/models") as r:
        kinds = {m["id"]: m["kind"] for m in json.loads(r.read())["data"]}
    assert kinds[MINILM] == "embedding" and kinds[RERANKER] == "reranker" and kinds[embed_server["model"]] == "chat"
    assert kinds[QWEN3_EMBEDDING] == "embedding" and kinds[JUDGE] == "reranker"


def test_ollama_embed_and_embeddings(embed_server):
    client = ollama.Client(host=embed_server["ollama"])
    answer = client.embed(model=MINILM, input=TEXTS)
    assert len(answer.embeddings) == len(TEXTS)
    for i, v in enumerate(answer.embeddings):
        # Truncated by default (the long text at 256 tokens), unit-length.
        assert_same(v, VECTORS[i], f"ollama, text {i}")
        assert abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-4
    assert answer.prompt_eval_count == sum(len(ids) for ids in IDS)
    one = client.embed(model=MINILM, input=TEXTS[2])
    assert_same(one.embeddings[0], VECTORS[2], "ollama, one string")
    with pytest.raises(ollama.ResponseError) as e:
        client.embed(model=MINILM, input=TEXTS[1], truncate=False)
    assert e.value.status_code == 400
    with pytest.raises(ollama.ResponseError) as e:
        client.embed(model="nope", input="x")
    assert e.value.status_code == 404
    old = client.embeddings(model=MINILM, prompt=TEXTS[3])
    assert_same(old.embedding, VECTORS[3], "ollama, /api/embeddings")
    shown = client.show(MINILM)
    assert shown.capabilities == ["embedding"]


def test_rerank_orders_as_the_reference(embed_server):
    case = REFERENCE["rerank"][0]
    want = sorted(range(len(case["scores"])), key=lambda i: -case["scores"][i])
    documents = [case["documents"][0], {"text": case["documents"][1]}, *case["documents"][2:]]
    for path in ("/v1/rerank", "/rerank"):
        status, answer = post(embed_server, path, {"model": RERANKER, "query": case["query"], "documents": documents})
        assert status == 200, answer
        assert [r["index"] for r in answer["results"]] == want
        for r in answer["results"]:
            assert abs(r["relevance_score"] - case["scores"][r["index"]]) < 1e-4
            assert r["document"]["text"] == case["documents"][r["index"]]
    status, answer = post(embed_server, "/v1/rerank", {"model": RERANKER, "query": case["query"],
                                                       "documents": case["documents"], "top_n": 2,
                                                       "return_documents": False})
    assert [r["index"] for r in answer["results"]] == want[:2] and "document" not in answer["results"][0]
    for body, param in [({"documents": []}, "documents"), ({"documents": [3]}, "documents"),
                        ({"documents": ["a"], "top_n": 0}, "top_n"), ({"documents": ["a"], "model": MINILM}, "model")]:
        status, answer = post(embed_server, "/v1/rerank", {"model": RERANKER, "query": "q", **body})
        assert (status, answer["error"]["param"]) == (400, param), answer


def test_decoder_embedder_shortens_vectors_and_the_judge_ranks(client, embed_server):
    # Token ids, as LangChain sends them: the tiny Qwen3-Embedding's vectors equal the reference.
    answer = client.embeddings.create(model=QWEN3_EMBEDDING, input=DECODER["rows"], encoding_format="float")
    for d, want in zip(answer.data, DECODER["vectors"]):
        assert_same(d.embedding, want, f"row {d.index}")
    # Trained for shorter vectors (Matryoshka): the first 16 numbers, unit-length again.
    short = client.embeddings.create(model=QWEN3_EMBEDDING, input=[DECODER["rows"][0]], dimensions=16,
                                     encoding_format="float").data[0].embedding
    assert len(short) == 16 and abs(math.sqrt(sum(x * x for x in short)) - 1) < 1e-5
    assert_same(short, DECODER["vectors"][0][:16], "16 dimensions")
    # The yes/no judge through /v1/rerank: its judge prompt, scores and order as the reference's.
    judge = REFERENCE["judge"]
    status, answer = post(embed_server, "/v1/rerank", {"model": JUDGE, "query": judge["query"],
                                                        "documents": judge["documents"]})
    assert status == 200, answer
    want = judge["scores"]
    assert [r["index"] for r in answer["results"]] == sorted(range(len(want)), key=lambda i: -want[i])
    for r in answer["results"]:
        assert abs(r["relevance_score"] - want[r["index"]]) < 1e-4, answer
    assert answer["usage"]["total_tokens"] == sum(len(ids) for ids in judge["ids"])
