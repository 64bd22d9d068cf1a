#!/usr/bin/env python3
"""Speculative decoding, measured: one stream at temperature 0 on edit prompts (source code to
give back with one name changed) and free prompts (open-ended writing), then 16 concurrent short
chats, against a FastMLX server started with each --speculative mode in turn (one after the
other, never at once). Prints decode tok/s per prompt and mode, the speed-up, whether the texts
are identical, and drafted/accepted tokens. With --llama-server (llama.cpp's `llama-server`, built
from the `llama-cpp-python` sdist) the same prompts go to llama.cpp on the same GGUF, without drafting
and with `--spec-type ngram-mod`, after FastMLX's modes (modes `llama.cpp` and `llama.cpp:ngram-mod`;
its texts are compared with its own run without drafting).

    FASTMLX_BIN=target/release/fastmlx python3 scripts/bench_speculative.py [--modes off,auto] \
        [--llama-server PATH --gguf .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf]
        [--draft-model PATH]   (auto and draft modes draft with it; add `draft` to --modes)
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


def wait_healthy(proc, port, name):
    """`proc` once its /health answers (both servers have one); exits if it never does."""
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc
        except Exception:
            time.sleep(0.2)
    proc.kill()
    sys.exit(f"{name} did not start")


def serve(binary, port, mode, draft=None):
    env = dict(os.environ, FASTMLX_PORT=str(port), FASTMLX_SPECULATIVE=mode,
               FASTMLX_PREFIX_CACHE_DISK_GB="0", FASTMLX_NO_PREFIX_CACHE="true")
    if draft and mode in ("auto", "draft"):
        env["FASTMLX_DRAFT_MODEL"] = draft
    proc = subprocess.Popen([binary, "serve"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    return wait_healthy(proc, port, "server")


def serve_llama_cpp(server, gguf, port, spec):
    """llama.cpp's server on the same GGUF: 16 slots of 2,048 tokens (the edit prompts and their
    answers fit one), as many threads as cores, drafting by `spec` (None: off)."""
    args = [server, "-m", gguf, "--port", str(port), "-c", "32768", "-np", "16",
            "-t", str(os.cpu_count()), "--no-webui"]
    if spec:
        args += ["--spec-type", spec]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return wait_healthy(proc, port, "llama-server")


def run_mode(binary, port, mode, max_tokens, llama=None, draft=None):
    if mode.startswith("llama.cpp"):
        spec = mode.partition(":")[2] or None
        proc = serve_llama_cpp(llama[0], llama[1], port, spec)
    else:
        proc = serve(binary, port, mode, draft)
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
    ap.add_argument("--llama-server", help="llama.cpp's llama-server binary")
    ap.add_argument("--gguf", default=str(ROOT / ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--draft-model", help="FastMLX's --draft-model for the auto and draft modes")
    args = ap.parse_args()
    binary = os.environ.get("FASTMLX_BIN", str(ROOT / "target/release/fastmlx"))
    modes = args.modes.split(",")
    if args.llama_server:
        modes += ["llama.cpp", "llama.cpp:ngram-mod"]
    llama = (args.llama_server, args.gguf)
    results = {m: run_mode(binary, args.port, m, args.max_tokens, llama, args.draft_model) for m in modes}
    # Each server's runs against its own first mode (FastMLX's first, llama.cpp without drafting).
    groups = [[m for m in modes if not m.startswith("llama.cpp")], [m for m in modes if m.startswith("llama.cpp")]]
    for group in filter(None, groups):
        base = results[group[0]]
        print(f"{'prompt':<10}" + "".join(f"{m + ' tok/s':>22}" for m in group)
              + "".join(f"{'x':>7}{'same':>6}{'drafted':>9}{'accepted':>9}" for m in group[1:]))
        for key in base:
            line = f"{key:<10}" + "".join(f"{results[m][key][1]:>22.1f}" for m in group)
            for m in group[1:]:
                text, rate, drafted, accepted = results[m][key]
                line += f"{rate / max(base[key][1], 1e-9):>7.2f}{'yes' if text == base[key][0] else 'NO':>6}"
                line += f"{drafted:>9}{accepted:>9}"
            print(line)
        print()


if __name__ == "__main__":
    main()
