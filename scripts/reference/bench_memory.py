"""A storm of long prompts against a running `fastmlx serve`, with its memory sampled.

Used by scripts/bench_memory.sh (issue 31): `--requests` unique prompts of about `--prompt-tokens`
tokens each, sent at once to /v1/chat/completions (streaming, EOS banned so each generates
`--gen-tokens`), while the server's resident memory (/proc/PID/status VmRSS) is sampled every
20 ms. Prints one line: memory before, peak during, 15 s after; answered / refused (503 with
Retry-After) / failed; throughput (prompt + output tokens per second of the storm).
"""

import argparse
import json
import threading
import time
import urllib.error
import urllib.request

RUN = time.time_ns()  # nothing of an earlier run is in the server's prefix cache


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def prompt(tokens, salt):
    vocab = ["river", "stone", "light", "garden", "north", "paper", "quiet", "engine", "silver", "market"]
    # About one token a word for SmolLM2's tokenizer.
    return f"Run {RUN}, text {salt}: " + " ".join(vocab[(i * 7 + salt * 3 + i // 11) % len(vocab)] for i in range(tokens))


def one(url, body, out):
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=1800) as resp:
            usage = None
            for raw in resp:
                line = raw.decode().strip()
                if line.startswith("data:") and line != "data: [DONE]":
                    chunk = json.loads(line[5:])
                    usage = chunk.get("usage") or usage
            out.append(("ok", usage))
    except urllib.error.HTTPError as e:
        out.append(("refused" if e.code == 503 and e.headers.get("Retry-After") else f"http {e.code}", None))
    except Exception as e:  # noqa: BLE001 - any other failure is counted as one
        out.append((f"failed: {e}", None))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--label", required=True)
    p.add_argument("--requests", type=int, default=12)
    p.add_argument("--prompt-tokens", type=int, default=1600)
    p.add_argument("--gen-tokens", type=int, default=32)
    p.add_argument("--after", type=float, default=15.0)
    a = p.parse_args()
    time.sleep(3)
    before = rss(a.pid)
    peak = [before]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss(a.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    out = []
    bodies = [{"messages": [{"role": "user", "content": prompt(a.prompt_tokens, i)}], "max_tokens": a.gen_tokens,
               "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
               "logit_bias": {"2": -100}} for i in range(a.requests)]
    began = time.perf_counter()
    threads = [threading.Thread(target=one, args=(a.url, b, out)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - began
    done.set()
    sampler.join()
    time.sleep(a.after)
    after = rss(a.pid)
    ok = [u for s, u in out if s == "ok"]
    tokens = sum((u or {}).get("prompt_tokens", 0) + (u or {}).get("completion_tokens", 0) for u in ok)
    refused = sum(1 for s, _ in out if s == "refused")
    failed = [s for s, _ in out if s not in ("ok", "refused")]
    mb = lambda b: b / 1e6  # noqa: E731
    print(f"{a.label:<28} before {mb(before):7.0f} MB  peak {mb(peak[0]):7.0f} MB  after {a.after:.0f} s {mb(after):7.0f} MB  "
          f"answered {len(ok)}/{a.requests}  refused {refused}  failed {len(failed)}  "
          f"storm {wall:6.1f} s  {tokens / wall:7.1f} tok/s" + (f"  {failed[:2]}" if failed else ""))


if __name__ == "__main__":
    main()
