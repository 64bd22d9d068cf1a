"""Embedding throughput and chat latency beside it (issue 34).

  --case http       256 texts to all-MiniLM-L6-v2 through `/v1/embeddings` of a running server:
                    texts per second (one request of 256, and 8 concurrent requests of 32), best of --runs.
  --case reference  the same 256 texts with mlx-embeddings 0.1.0's BERT in this process: length-sorted
                    batches of 32, as sentence-transformers batches (run with OpenBLAS preloaded, as the
                    servers' references are).
  --case itl        8 chat streams decode on the server (streaming /v1/completions, EOS banned), alone
                    and while one 256-text embedding request runs: their inter-token latency p50/p95.

    .cache/venv/bin/python scripts/reference/bench_embeddings.py --case http --url http://127.0.0.1:8091
"""

import argparse
import importlib.util
import json
import sys
import threading
import time
import types
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MINILM = ROOT / ".cache/models/all-MiniLM-L6-v2"
sys.path.insert(0, str(Path(__file__).parent))
from bench_server import one_request, percentile  # noqa: E402

WORDS = ["index", "vector", "search", "function", "return", "the", "model", "query", "document", "cache",
         "请", "数据", "🦀", "let", "mut", "async", "await", "struct", "impl", "token"]


def texts(n=256):
    """Deterministic texts of 5 to ~180 words: prose, code-like, a little CJK and emoji."""
    out = []
    for i in range(n):
        words = 5 + (i * 37) % 175
        out.append(f"chunk {i}: " + " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(words)))
    return out


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def http(args):
    data = texts()
    post(args.url, "/v1/embeddings", {"model": args.model, "input": data[:4], "truncate": True})  # loads the model
    best_one = best_many = 0.0
    for _ in range(args.runs):
        t = time.perf_counter()
        answer = post(args.url, "/v1/embeddings", {"model": args.model, "input": data, "truncate": True})
        assert len(answer["data"]) == len(data)
        best_one = max(best_one, len(data) / (time.perf_counter() - t))
        t = time.perf_counter()
        threads = [threading.Thread(target=post, args=(args.url, "/v1/embeddings",
                                                       {"model": args.model, "input": data[i::8], "truncate": True}))
                   for i in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        best_many = max(best_many, len(data) / (time.perf_counter() - t))
    print(f"{args.label}: 256 texts in one request {best_one:7.1f} texts/s | in 8 concurrent requests {best_many:7.1f} texts/s",
          flush=True)


def reference(args):
    import mlx.core as mx
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("mlx_embeddings")
    pkg = types.ModuleType("mlx_embeddings")
    pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules["mlx_embeddings"] = pkg
    from mlx_embeddings.models import bert

    config = json.loads((MINILM / "config.json").read_text())
    model = bert.Model(bert.ModelArgs.from_dict(config))
    model.load_weights(list(model.sanitize(mx.load(str(MINILM / "model.safetensors"))).items()), strict=False)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(MINILM))
    data = texts()
    best = 0.0
    for _ in range(args.runs + 1):  # the first run warms up
        t = time.perf_counter()
        ids = [tokenizer(x, truncation=True, max_length=256)["input_ids"] for x in data]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        for b in range(0, len(order), 32):
            rows = [ids[i] for i in order[b:b + 32]]
            width = max(len(r) for r in rows)
            x = mx.array([r + [0] * (width - len(r)) for r in rows])
            mask = mx.array([[1] * len(r) + [0] * (width - len(r)) for r in rows])
            mx.eval(model(x, attention_mask=mask).text_embeds)
        best = max(best, len(data) / (time.perf_counter() - t))
    print(f"mlx-embeddings 0.1.0 in-process (batches of 32, length-sorted): {best:7.1f} texts/s", flush=True)


def itl(args):
    def streams(results):
        def one(c):
            body = {"prompt": f"Story {c} {time.time_ns()}: the river", "max_tokens": args.gen_tokens, "temperature": 0,
                    "stream": True, "logit_bias": {str(t): -100 for t in args.ban}}
            if args.chat_model:
                body["model"] = args.chat_model
            results.append(one_request(args.url, body)[1])
        threads = [threading.Thread(target=one, args=(c,)) for c in range(8)]
        for th in threads:
            th.start()
        return threads

    data = texts()
    post(args.url, "/v1/embeddings", {"model": args.model, "input": data[:4], "truncate": True})
    for label, embed in (("alone", False), ("with 256 texts embedding", True)):
        results = []
        threads = streams(results)
        took = None
        if embed:
            time.sleep(1.0)  # the streams are decoding
            t = time.perf_counter()
            post(args.url, "/v1/embeddings", {"model": args.model, "input": data, "truncate": True})
            took = time.perf_counter() - t
        for th in threads:
            th.join()
        gaps = [(b - a) * 1e3 for s in results for a, b in zip(s, s[1:])]
        extra = f" | the embedding request took {took:.1f} s" if took else ""
        print(f"{args.label} 8 chat streams {label:>26}: ITL p50 {percentile(gaps, 50):6.1f} ms p95 "
              f"{percentile(gaps, 95):6.1f} ms{extra}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--case", choices=["http", "reference", "itl"], required=True)
    p.add_argument("--url", default="http://127.0.0.1:8091")
    p.add_argument("--model", default="all-MiniLM-L6-v2")
    p.add_argument("--chat-model", default=None)
    p.add_argument("--label", default="fastmlx serve")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--gen-tokens", type=int, default=200)
    p.add_argument("--ban", type=int, nargs="*", default=[0, 1, 2], help="token ids banned (EOS)")
    args = p.parse_args()
    {"http": http, "reference": reference, "itl": itl}[args.case](args)


if __name__ == "__main__":
    main()
