"""Load generator for any OpenAI-compatible server: concurrent streaming /v1/completions.

Used by scripts/bench_server.sh to measure mlx-lm's server (and FastMLX's once it serves
HTTP) the same way `fastmlx bench --concurrency` measures the engine in-process:

    .cache/venv/bin/python scripts/reference/bench_server.py --url http://127.0.0.1:8090 \\
        --concurrency 1,16 --prompt-words 100 --gen-tokens 128

Each level runs `concurrency` clients sending `--requests-per-client` requests one after the
other; prints aggregate output tok/s (tokens counted from the stream), TTFT and inter-token
latency percentiles. EOS is suppressed with logit_bias so every request generates exactly
--gen-tokens.

Two more cases (issue 14), selected with --case:
  long-arrival  8 streams decode while a long prompt (--long-words) arrives: the streams' inter-token
                latency p95 before it and while it is prefilled, and its time to first token.
  interactive   4 long prompts are sent, then (1 s later) a short request with `priority: -10` (vLLM's
                field, lower = sooner; servers without lanes ignore it): its time to first token.
"""

import argparse
import json
import statistics
import threading
import time
import urllib.request


RUN = time.time_ns()  # in every prompt: nothing of an earlier run is in a server's prefix cache


def prompt(words: int, salt: int) -> str:
    vocab = ["river", "stone", "light", "garden", "north", "paper", "quiet", "engine", "silver", "market"]
    return f"Run {RUN}, story {salt}: " + " ".join(vocab[(i * 7 + salt) % len(vocab)] for i in range(words))


def one_request(url, body, headers=None):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json", "Authorization": "Bearer x", **(headers or {})})
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


def body_for(args, text, tokens, **extra):
    body = {"prompt": text, "max_tokens": tokens, "temperature": 0, "stream": True,
            "logit_bias": {str(t): -100 for t in args.ban}, **extra}
    if args.model:
        body["model"] = args.model
    return body


def in_thread(fn, *a):
    out = {}
    t = threading.Thread(target=lambda: out.update(result=fn(*a)))
    t.start()
    return t, out


def long_arrival(args):
    streams = [in_thread(one_request, args.url, body_for(args, prompt(args.prompt_words, 700 + i), args.gen_tokens)) for i in range(8)]
    time.sleep(args.settle)
    sent = time.perf_counter()
    long_start, long_stamps = one_request(args.url, body_for(args, prompt(args.long_words, 999), 4))
    arrived = long_stamps[0] if long_stamps else time.perf_counter()
    for t, _ in streams:
        t.join()
    gaps_before, gaps_during = [], []
    for _, out in streams:
        _, stamps = out["result"]
        for a, b in zip(stamps, stamps[1:]):
            (gaps_during if b > sent and a < arrived else gaps_before if b <= sent else []).append((b - a) * 1e3)
    print(f"{args.label} long prompt ({args.long_words} words) arriving while 8 streams decode: its TTFT {(arrived - long_start):.2f} s"
          f" | streams' ITL p95 before {percentile(gaps_before, 95):.0f} ms, while it prefills {percentile(gaps_during, 95):.0f} ms"
          f" (max {max(gaps_during, default=0):.0f} ms)", flush=True)


def interactive(args):
    longs = [in_thread(one_request, args.url, body_for(args, prompt(args.long_words, 800 + i), 16)) for i in range(4)]
    time.sleep(1.0)
    start, stamps = one_request(args.url, body_for(args, "def fibonacci(n):", 8, priority=-10), {"X-Priority": "-10"})
    ttft = (stamps[0] - start) if stamps else float("nan")
    for t, _ in longs:
        t.join()
    long_ttft = [(out["result"][1][0] - out["result"][0]) for _, out in longs if out["result"][1]]
    print(f"{args.label} short interactive request under 4 long prefills ({args.long_words} words): its TTFT {ttft:.2f} s"
          f" | the long ones' TTFT max {max(long_ttft, default=0):.1f} s", flush=True)


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
    p.add_argument("--case", choices=["concurrency", "long-arrival", "interactive"], default="concurrency")
    p.add_argument("--long-words", type=int, default=1500, help="words of the long prompt (~1.3 tokens each)")
    p.add_argument("--settle", type=float, default=3.0, help="seconds the 8 streams decode before the long prompt")
    args = p.parse_args()
    if args.case == "long-arrival":
        return long_arrival(args)
    if args.case == "interactive":
        return interactive(args)
    for clients in [int(c) for c in args.concurrency.split(",")]:
        level(args, clients)


if __name__ == "__main__":
    main()
