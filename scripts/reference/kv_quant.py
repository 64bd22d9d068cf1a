"""Reference greedy outputs with a quantized KV cache (issue 33), on FastMLX's tiny models.

FastMLX quantizes by position: a forward whose first token sits at `start` or later reads and
writes the cache quantized, one before it at full precision (its prefill is cut at `start`).

- `start` 0: mlx-lm's own `QuantizedKVCache` from the first token (every full-attention cache
  made quantized before the prompt), attention by mlx-lm's `quantized_scaled_dot_product_attention`.
- `start` inside the answer: mlx-lm's `generate_step(kv_bits, kv_group_size, quantized_kv_start)`
  (it converts after the forward that reaches `start`: the same positions).
- Where mlx-lm has no quantized path (`RotatingKVCache.to_quantized` is "NYI": windowed layers;
  attention sinks: "Quantized SDPA does not support attention sinks"; a layer kind whose forward
  fails on quantized caches), the reference is dense attention over keys and values quantized
  and dequantized as they are written (what a quantized cache holds), with the same start rule,
  and the case says so (`"reference": "dequantized"`).

Regenerate (from the repository root, after `cargo build`):

    .cache/venv/bin/python scripts/reference/kv_quant.py

Writes tests/data/reference/kv_quant.json, and tests/data/reference/kv_quant_smollm2.json: SmolLM2's
4-bit MLX export (`.cache/models/SmolLM2-135M-Instruct-mlx-4bit`, made by export_mlx_model.py) with
mlx-lm's QuantizedKVCache from the first token, on the first prompt of smollm2_mlx_4bit.json.
"""

import json
import subprocess
import tempfile
from importlib.metadata import version
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache, make_prompt_cache
from mlx_lm.utils import load_model

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests/data/reference/kv_quant.json"
SMOLLM2_OUT = ROOT / "tests/data/reference/kv_quant_smollm2.json"
SMOLLM2_DIR = ROOT / ".cache/models/SmolLM2-135M-Instruct-mlx-4bit"
SMOLLM2_FORMATS = [(8, 64, 0), (4, 64, 0)]
BINARY = ROOT / "target/debug/fastmlx"
SEED = 7
PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 32, 84, 104, 105, 115, 32, 105, 115]
N_NEW = 24
# The attention families: plain, sliding window, local/global with rotating caches and QK-norm, sinks,
# Llama-4-style query scaling, KV-shared layers with keys as values, the two linear-attention
# hybrids (their recurrent states stay as they are), NoPE layers. (The tiny Qwen3's and Seed-OSS's
# heads are 48 wide: no group size MLX takes divides them, and FastMLX refuses the format at load.)
ARCHS = ["llama", "mistral", "gemma3_text", "gpt_oss", "ministral3", "gemma4_text", "qwen3_5", "lfm2", "smollm3"]
# (bits, group size, start): from the first token, and from a position inside the answer.
# The tiny models' heads are 32 wide: group size 32.
FORMATS = [(8, 32, 0), (4, 32, 0), (8, 32, len(PROMPT) + 5)]
# Past the windows (windowed layers drop old keys twice), quantized from the first token.
LONG_PROMPT = [(i * 37 + 11) % 256 for i in range(300)]
LONG_NEW = 300
LONG_ARCHS = ["gemma3_text"]


def argmax(x):
    return mx.argmax(x, axis=-1)


def round_trip(x, group, bits):
    return mx.dequantize(*mx.quantize(x, group_size=group, bits=bits), group_size=group, bits=bits)


def rounded(base):
    """`base` (KVCache or RotatingKVCache) holding keys and values as a quantized cache would:
    from the forward at position `start` on, everything it holds and everything written after
    is quantized and dequantized."""

    class Rounded(base):
        def __init__(self, *args, group, bits, start, **kwargs):
            super().__init__(*args, **kwargs)
            # Not `bits`: mlx-lm takes a cache with that attribute for a QuantizedKVCache.
            self.rounding, self.start, self.quantized = (group, bits), start, False

        def update_and_fetch(self, keys, values):
            if not self.quantized and self.offset >= self.start:
                self.quantized = True
                if self.keys is not None:
                    self.keys = round_trip(self.keys, *self.rounding)
                    self.values = round_trip(self.values, *self.rounding)
            if self.quantized:
                keys, values = round_trip(keys, *self.rounding), round_trip(values, *self.rounding)
            return super().update_and_fetch(keys, values)

    return Rounded


def dequantized_cache(model, group, bits, start):
    caches = []
    for c in make_prompt_cache(model):
        if type(c) is KVCache:
            r = rounded(KVCache)(group=group, bits=bits, start=start)
        elif type(c) is RotatingKVCache:
            r = rounded(RotatingKVCache)(c.max_size, keep=c.keep, group=group, bits=bits, start=start)
        else:
            r = c
        caches.append(r)
    return caches


def run(model, prompt, n_new, **kwargs):
    steps = generate_step(mx.array(prompt), model, max_tokens=n_new, sampler=argmax, **kwargs)
    return [int(token) for token, _ in steps]


def mlx_lm_quantized(model, prompt, n_new, group, bits, start):
    """mlx-lm's own quantized path, or None where it has none for a layer of this model."""
    plain = make_prompt_cache(model)
    if any(type(c) is RotatingKVCache for c in plain):
        return None
    try:
        if start == 0:
            cache = [QuantizedKVCache(group_size=group, bits=bits) if type(c) is KVCache else c for c in plain]
            return run(model, prompt, n_new, prompt_cache=cache)
        return run(model, prompt, n_new, kv_bits=bits, kv_group_size=group, quantized_kv_start=start)
    except (ValueError, NotImplementedError, AttributeError, TypeError) as e:
        print("  no mlx-lm quantized path:", type(e).__name__, e)
        return None


def case(model, arch, prompt, n_new, bits, group, start):
    ids = mlx_lm_quantized(model, prompt, n_new, group, bits, start)
    reference = "mlx-lm"
    if ids is None:
        reference = "dequantized"
        ids = run(model, prompt, n_new, prompt_cache=dequantized_cache(model, group, bits, start))
    print(arch, bits, group, start, reference, ids[:12])
    return {"arch": arch, "bits": bits, "group_size": group, "start": start, "reference": reference, "output_ids": ids}


def make(arch, tmp):
    out = Path(tmp) / arch
    subprocess.run([str(BINARY), "make-test-model", "--arch", arch, "--seed", str(SEED), str(out)], check=True)
    return out


def main():
    mx.set_default_device(mx.cpu)
    cases, long_cases = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for arch in ARCHS:
            model, _ = load_model(make(arch, tmp))
            for bits, group, start in FORMATS:
                cases.append(case(model, arch, PROMPT, N_NEW, bits, group, start))
        for arch in LONG_ARCHS:
            model, _ = load_model(make(arch, tmp))
            long_cases.append(case(model, arch, LONG_PROMPT, LONG_NEW, 8, 32, 0))
    OUT.write_text(
        json.dumps(
            {
                "description": "greedy decoding with a quantized KV cache on `fastmlx make-test-model` tiny models "
                "(float32, CPU): mlx-lm's QuantizedKVCache / kv_bits where it has a path, else dense "
                "attention over quantized-then-dequantized keys and values",
                "regenerate": ".cache/venv/bin/python scripts/reference/kv_quant.py",
                "tool_versions": {p: version(p) for p in ["mlx", "mlx-cpu", "mlx-lm"]},
                "seed": SEED,
                "prompt_ids": PROMPT,
                "cases": cases,
                "long_prompt_ids": LONG_PROMPT,
                "long_cases": long_cases,
            },
            indent=1,
        )
        + "\n"
    )


def smollm2():
    from mlx_lm import load

    model, _ = load(str(SMOLLM2_DIR))
    prompt = json.loads((ROOT / "tests/data/reference/smollm2_mlx_4bit.json").read_text())["cases"][0]["prompt_ids"]
    cases = []
    for bits, group, start in SMOLLM2_FORMATS:
        ids = mlx_lm_quantized(model, prompt, N_NEW, group, bits, start)
        print("smollm2", bits, group, start, ids)
        cases.append({"bits": bits, "group_size": group, "start": start, "reference": "mlx-lm", "output_ids": ids})
    SMOLLM2_OUT.write_text(
        json.dumps(
            {
                "description": "mlx-lm greedy decoding with QuantizedKVCache from the first token on SmolLM2's 4-bit "
                "MLX export (float32 compute, CPU)",
                "regenerate": ".cache/venv/bin/python scripts/reference/kv_quant.py",
                "tool_versions": {p: version(p) for p in ["mlx", "mlx-cpu", "mlx-lm"]},
                "prompt_ids": prompt,
                "cases": cases,
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
    smollm2()
