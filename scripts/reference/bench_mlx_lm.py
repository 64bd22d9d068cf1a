"""mlx-lm's single-stream speed on the same models and prompts as `fastmlx bench`.

Run by scripts/bench.sh; by hand (from the repository root):

    .cache/venv/bin/python scripts/reference/bench_mlx_lm.py --prompt-tokens 512 --gen-tokens 128

Times mlx-lm's own `generate_step` (greedy, EOS ignored) the way `fastmlx bench` times itself:
prompt tok/s = prompt tokens / time to the first token; decode tok/s = tokens after the first /
time after the first. Median of --runs after one warm-up. With --kv-bits, mlx-lm's
`QuantizedKVCache` from the first token (as FastMLX's `--kv-start 0`; with --kv-start N, mlx-lm's
`quantized_kv_start`), and the caches' bytes at the
end (KV).
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache
from mlx_lm.utils import load

sys.path.insert(0, str(Path(__file__).resolve().parent))
from smollm2_gguf import GGUF, ROOT, gguf_model  # noqa: E402

MLX_DIR = ROOT / ".cache/models/SmolLM2-135M-Instruct-mlx-4bit"


def bench_prompt(n):  # as fastmlx's cli/bench_cmd.rs
    return [1000 + (i * 7919) % 30000 for i in range(n)]  # salt 0


def caches(model, kv):
    cache = make_prompt_cache(model)
    if kv is None:
        return cache
    bits, group = kv
    return [QuantizedKVCache(group_size=group, bits=bits) if type(c) is KVCache else c for c in cache]


def once(model, prompt, gen_tokens, kv=None, start=0):
    # From a start past 0: mlx-lm's own conversion (`quantized_kv_start`), full precision before it.
    cache = caches(model, kv if not start else None)
    quantize = {"kv_bits": kv[0], "kv_group_size": kv[1], "quantized_kv_start": start} if kv and start else {}
    tic = time.perf_counter()
    steps = generate_step(
        mx.array(prompt), model, max_tokens=gen_tokens, sampler=lambda x: mx.argmax(x, axis=-1), prompt_cache=cache,
        **quantize,
    )
    first = None
    for n, (token, _) in enumerate(steps):
        if n == 0:
            first = time.perf_counter()
    end = time.perf_counter()
    kv_bytes = sum(c.nbytes for c in cache)
    return len(prompt) / (first - tic), (gen_tokens - 1) / (end - first), first - tic, kv_bytes


def bench(name, model, args):
    prompt = bench_prompt(args.prompt_tokens)
    kv = (args.kv_bits, args.kv_group_size) if args.kv_bits else None
    once(model, prompt[: min(len(prompt), 256)], 4, kv, args.kv_start)  # warm-up
    mx.reset_peak_memory()
    runs = [once(model, prompt, args.gen_tokens, kv, args.kv_start) for _ in range(args.runs)]
    peak = mx.get_peak_memory()
    label = f"kv {args.kv_bits}-bit g{args.kv_group_size} from {args.kv_start}" if kv else "kv full"
    print(
        f"mlx-lm   {name:<40} prompt {args.prompt_tokens:>5} tok: {statistics.median(r[0] for r in runs):>8.1f} tok/s,"
        f" TTFT {statistics.median(r[2] for r in runs) * 1e3:>7.0f} ms"
        f" | decode {args.gen_tokens:>4} tok: {statistics.median(r[1] for r in runs):>7.1f} tok/s"
        f" | KV {runs[-1][3] / 1e6:.1f} MB ({label}) | peak {peak / 1e6:.0f} MB | cpu"
    )


def main():
    if "libopenblas" not in os.environ.get("LD_PRELOAD", ""):
        # Dense f32 matmuls: the same OpenBLAS FastMLX links, not the wheel's reference BLAS.
        os.execve(sys.executable, [sys.executable, *sys.argv], dict(os.environ, LD_PRELOAD="libopenblas.so.0"))
    p = argparse.ArgumentParser()
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--skip-packed", action="store_true", help="skip the (slow) packed-weight runs")
    p.add_argument("--kv-bits", type=int, default=0, help="quantize the KV cache (QuantizedKVCache from the start)")
    p.add_argument("--kv-group-size", type=int, default=64)
    p.add_argument("--kv-start", type=int, default=0, help="quantize from this position on (quantized_kv_start)")
    args = p.parse_args()
    model, _, _ = gguf_model(GGUF, dense=True)
    bench(GGUF.stem + " (f32)", model, args)
    if args.skip_packed:
        return
    model, _, _ = gguf_model(GGUF)
    bench(GGUF.stem, model, args)
    if MLX_DIR.exists():
        model, _ = load(str(MLX_DIR))
        bench(MLX_DIR.name, model, args)


if __name__ == "__main__":
    main()
