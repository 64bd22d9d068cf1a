#!/usr/bin/env python3
"""Speculative decoding, measured: one stream at temperature 0 on edit prompts (source code to
give back with one name changed) and free prompts (open-ended writing), then 16 concurrent short
chats, against a FastMLX server started with each --speculative mode in turn (one after the
other, never at once). Prints decode tok/s per prompt and mode, the speed-up, whether the texts
are identical, and drafted/accepted tokens.

    FASTMLX_BIN=target/release/fastmlx python3 scripts/bench_speculative.py [--modes off,auto]
"""
import argparse, json, os, pathlib, subprocess, sys, time, urllib.request
from concurrent.futures import ThreadPoolExecutor

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = ["src-tauri/src/engine/speculative/ngram.rs", "src-tauri/src/engine/lanes.rs",
           "src-tauri/src/engine/batch.rs"]
RENAMES = [("lookup", "finder"), ("effective", "aged"), ("seqs", "rows")]
FREE = ["Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "Explain how a bicycle stays upright, for a curious ten-year-old.",
        "Describe a busy market in the morning, with its sounds and smells."]


def post(port, path, body, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def chat(port, content, max_tokens):
    out = post(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": content}],
                                               "temperature": 0, "max_tokens": max_tokens})
    return out["choices"][0]["message"]["content"], out.get("timings", {})


def edit_prompts():
    out = []
    for src, (old, new) in zip(SOURCES, RENAMES):
        code = "\n".join((ROOT / src).read_text().splitlines()[:60])
        out.append(f"Here is some Rust code:\n\n```rust\n{code}\n```\n\nCopy the code exactly, "
                   f"but rename `{old}` to `{new}` everywhere. Answer with the code only.")
    return out


def serve(binary, port, mode):
    env = dict(os.environ, FASTMLX_PORT=str(port), FASTMLX_SPECULATIVE=mode,
               FASTMLX_PREFIX_CACHE_DISK_GB="0", FASTMLX_NO_PREFIX_CACHE="true")
    proc = subprocess.Popen([binary, "serve"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc
        except Exception:
            time.sleep(0.2)
    proc.kill()
    sys.exit("server did not start")


def run_mode(binary, port, mode, max_tokens):
    proc = serve(binary, port, mode)
    try:
        chat(port, "Say hello.", 8)  # warm-up
        rows = {}
        for kind, prompts in (("edit", edit_prompts()), ("free", FREE)):
            for i, p in enumerate(prompts):
                text, t = chat(port, p, max_tokens)
                rows[f"{kind}{i}"] = (text, t.get("predicted_per_second", 0.0),
                                      t.get("draft_n", 0), t.get("draft_n_accepted", 0))
        shorts = [f"Give me one fact about the number {n}." for n in range(16)]
        began = time.time()
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda p: chat(port, p, 48), shorts))
        tokens = sum(t.get("predicted_n", 0) for _, t in results)
        rows["16 chats"] = ("".join(r for r, _ in results), tokens / (time.time() - began), 0, 0)
        return rows
    finally:
        proc.terminate()
        proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="off,auto")
    ap.add_argument("--port", type=int, default=8137)
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args()
    binary = os.environ.get("FASTMLX_BIN", str(ROOT / "target/release/fastmlx"))
    modes = args.modes.split(",")
    results = {m: run_mode(binary, args.port, m, args.max_tokens) for m in modes}
    base = results[modes[0]]
    print(f"{'prompt':<10}" + "".join(f"{m + ' tok/s':>14}" for m in modes)
          + "".join(f"{m + ' x':>9}{'same':>6}{'drafted':>9}{'accepted':>9}" for m in modes[1:]))
    for key in base:
        line = f"{key:<10}" + "".join(f"{results[m][key][1]:>14.1f}" for m in modes)
        for m in modes[1:]:
            text, rate, drafted, accepted = results[m][key]
            line += f"{rate / max(base[key][1], 1e-9):>9.2f}{'yes' if text == base[key][0] else 'NO':>6}"
            line += f"{drafted:>9}{accepted:>9}"
        print(line)


if __name__ == "__main__":
    main()
