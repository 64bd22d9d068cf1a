"""Load generator for any OpenAI-compatible server: concurrent streaming /v1/completions.

Used by scripts/bench_server.sh to measure mlx-lm's server (and FastMLX's once it serves
HTTP) the same way `fastmlx bench --concurrency` measures the engine in-process:

    .cache/venv/bin/python scripts/reference/bench_server.py --url http://127.0.0.1:8090 \\
        --concurrency 1,16 --prompt-words 100 --gen-tokens 128

Each level runs `concurrency` clients sending `--requests-per-client` requests one after the
other; prints aggregate output tok/s (tokens counted from the stream), TTFT and inter-token
latency percentiles. EOS is suppressed with logit_bias so every request generates exactly
--gen-tokens.
"""

import argparse
import json
import statistics
import threading
import time
import urllib.request


def prompt(words: int, salt: int) -> str:
    vocab = ["river", "stone", "light", "garden", "north", "paper", "quiet", "engine", "silver", "market"]
    return f"Story {salt}: " + " ".join(vocab[(i * 7 + salt) % len(vocab)] for i in range(words))


def one_request(url, body):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json", "Authorization": "Bearer x"})
    start = time.perf_counter()
    stamps = []
    with urllib.request.urlopen(req, timeout=600) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            choices = chunk.get("choices") or []
            if choices and choices[0].get("text"):
                stamps.append(time.perf_counter())
    return start, stamps


def percentile(values, p):
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def level(args, clients):
    results, lock = [], threading.Lock()

    def client(c):
        for r in range(args.requests_per_client):
            body = {"prompt": prompt(args.prompt_words, c * 100 + r), "max_tokens": args.gen_tokens,
                    "temperature": 0, "stream": True, "logit_bias": {str(t): -100 for t in args.ban}}
            if args.model:
                body["model"] = args.model
            start, stamps = one_request(args.url, body)
            with lock:
                results.append((start, stamps))

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    tokens = sum(len(s) for _, s in results)
    ttft = [(s[0] - st) * 1e3 for st, s in results if s]
    itl = [(b - a) * 1e3 for _, s in results for a, b in zip(s, s[1:])]
    print(f"{args.label} concurrency {clients:>3}: {tokens / wall:>7.1f} output tok/s | TTFT p50 {percentile(ttft, 50):>7.0f} ms"
          f" p95 {percentile(ttft, 95):>7.0f} ms | ITL p50 {percentile(itl, 50):>6.1f} ms p95 {percentile(itl, 95):>6.1f} ms"
          f" | {tokens} tokens in {wall:.1f}s", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", default="http://127.0.0.1:8090")
    p.add_argument("--model", default="", help="model name to send (default: none, the server's own)")
    p.add_argument("--label", default="server")
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--prompt-words", type=int, default=100)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--requests-per-client", type=int, default=1)
    p.add_argument("--ban", type=int, nargs="*", default=[0, 2], help="token ids to suppress (EOS)")
    args = p.parse_args()
    for clients in [int(c) for c in args.concurrency.split(",")]:
        level(args, clients)


if __name__ == "__main__":
    main()
