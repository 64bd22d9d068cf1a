"""Where a forward's time goes on MLX's CPU backend, per decoder layer, at several context lengths.

SmolLM2-135M's shapes (hidden 576, 9 query heads, 3 key/value heads of 64, MLP 1536, 30 layers), f32,
random weights: the cost of each part of one layer for a decode step (1 token) and for a 512-token
prefill chunk, after `context` tokens already cached. MLX's own CPU attention is measured part by part
(the softmax separately); FastMLX runs that softmax on the host instead (`host_softmax.rs`), so its
row shows what the host replaces. Run with OpenBLAS preloaded, as FastMLX links it:

    LD_PRELOAD=libopenblas.so.0 .cache/venv/bin/python scripts/reference/profile_layers.py
"""

import argparse
import time

import mlx.core as mx

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MLP, LAYERS = 576, 9, 3, 64, 1536, 30


def timed(fn, runs):
    mx.eval(fn())
    start = time.perf_counter()
    for _ in range(runs):
        mx.eval(fn())
    return (time.perf_counter() - start) / runs * 1e3


def profile(context, tokens, runs):
    w = lambda o, i: mx.random.normal((o, i)) * 0.02  # noqa: E731
    wq, wk, wv, wo = w(HEADS * HEAD_DIM, HIDDEN), w(KV_HEADS * HEAD_DIM, HIDDEN), w(KV_HEADS * HEAD_DIM, HIDDEN), w(HIDDEN, HEADS * HEAD_DIM)
    wg, wu, wd = w(MLP, HIDDEN), w(MLP, HIDDEN), w(HIDDEN, MLP)
    x = mx.random.normal((1, tokens, HIDDEN))
    keys = mx.random.normal((1, KV_HEADS, context + tokens, HEAD_DIM))
    values = mx.random.normal((1, KV_HEADS, context + tokens, HEAD_DIM))
    q = mx.random.normal((1, KV_HEADS, (HEADS // KV_HEADS) * tokens, HEAD_DIM))
    scores = q @ keys.swapaxes(-1, -2)
    probs = mx.softmax(scores, axis=-1)
    mx.eval(wq, wk, wv, wo, wg, wu, wd, x, keys, values, q, scores, probs)
    parts = {
        "q/k/v/o projections": lambda: (x @ wq.T, x @ wk.T, x @ wv.T, (x @ wq.T) @ wo.T),
        "RoPE (q and k)": lambda: mx.fast.rope(q.reshape(1, HEADS, tokens, HEAD_DIM), HEAD_DIM, traditional=False, base=10000.0, scale=1.0, offset=context),
        "attention q.k^T": lambda: q @ keys.swapaxes(-1, -2),
        "attention softmax (MLX's)": lambda: mx.softmax(scores, axis=-1),
        "attention probs.v": lambda: probs @ values,
        "MLP (gate, up, down)": lambda: (mx.sigmoid(x @ wg.T) * (x @ wg.T) * (x @ wu.T)) @ wd.T,
    }
    return {name: timed(fn, runs) for name, fn in parts.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="512,2048,6144,16384")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    for tokens in (1, 512):
        print(f"\n{'decode step (1 token)' if tokens == 1 else 'prefill chunk (512 tokens)'}: ms per layer (x{LAYERS} layers)")
        rows = {c: profile(c, tokens, args.runs) for c in map(int, args.contexts.split(","))}
        names = list(next(iter(rows.values())))
        print(f"{'part':<28}" + "".join(f"{f'ctx {c}':>12}" for c in rows))
        for name in names:
            print(f"{name:<28}" + "".join(f"{rows[c][name]:>12.2f}" for c in rows))
        print(f"{'sum':<28}" + "".join(f"{sum(rows[c].values()):>12.2f}" for c in rows))


if __name__ == "__main__":
    main()
