"""Reference greedy outputs of mlx-lm on FastMLX's tiny random-weight models.

FastMLX writes the models itself (`fastmlx make-test-model`, the same code the Rust tests
use); this script loads each folder with mlx-lm's own loader and model classes and decodes
greedily from fixed prompt ids. The Rust test `tests/tiny_models.rs` must reproduce the ids.
Regenerate (from the repository root, after `cargo build`):

    .cache/venv/bin/python scripts/reference/tiny_models.py

Writes tests/data/reference/tiny_models.json.
"""

import json
import subprocess
import tempfile
from importlib.metadata import version
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.utils import load_model

# mlx-lm 0.32.2 passes `global_scale=None` to `mx.gather_qmm`, which the mlx 0.32.2 wheel
# rejects, so stock mlx-lm cannot run a quantized MoE model on that pair. Dropping a `None`
# global scale changes nothing numerically (it is how the call reads without one).
_gather_qmm = mx.gather_qmm


def _gather_qmm_without_none_scale(*args, global_scale=None, **kwargs):
    if global_scale is not None:
        kwargs["global_scale"] = global_scale
    return _gather_qmm(*args, **kwargs)


mx.gather_qmm = _gather_qmm_without_none_scale

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests/data/reference/tiny_models.json"
BINARY = ROOT / "target/debug/fastmlx"
SEED = 7
# Longer than the tiny Mistral's sliding window (12), so the window matters in prefill too.
PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 32, 84, 104, 105, 115, 32, 105, 115]
N_NEW = 24
# (name, arch, bits, extra flags): every architecture dense, quantized variants (MoE ones
# with 8-bit router gates), experts stored one by one as Hugging Face does, and multimodal
# wrappers around a text model (Gemma 4 also as its mixture-of-experts variant); gpt-oss with --per-expert is OpenAI's release layout (fused
# gate/up rows, mxfp4 blocks).
MODELS = [
    ("llama", "llama", None, []),
    ("mistral", "mistral", None, []),
    ("qwen2", "qwen2", None, []),
    ("qwen3", "qwen3", None, []),
    ("phi3", "phi3", None, []),
    ("llama-q4", "llama", 4, []),
    ("qwen3-q8", "qwen3", 8, []),
    ("qwen3_moe", "qwen3_moe", None, []),
    ("qwen3_moe-per-expert", "qwen3_moe", None, ["--per-expert"]),
    ("qwen3_moe-q4", "qwen3_moe", 4, []),
    ("qwen2_moe", "qwen2_moe", None, []),
    ("mixtral", "mixtral", None, []),
    ("mixtral-q4-per-expert", "mixtral", 4, ["--per-expert"]),
    ("gemma3_text", "gemma3_text", None, []),
    ("gemma3-wrapped", "gemma3_text", None, ["--wrapped"]),
    ("gemma3_text-q4", "gemma3_text", 4, []),
    ("mistral3-wrapped", "mistral", None, ["--wrapped"]),
    ("mixtral-mxfp4", "mixtral", 4, ["--mode", "mxfp4"]),
    ("llama-nvfp4", "llama", 4, ["--mode", "nvfp4"]),
    ("qwen2_moe-mxfp8", "qwen2_moe", 8, ["--mode", "mxfp8"]),
    ("gpt_oss", "gpt_oss", None, []),
    ("gpt_oss-openai-mxfp4", "gpt_oss", None, ["--per-expert"]),
    ("gpt_oss-mxfp4", "gpt_oss", 4, ["--mode", "mxfp4"]),
    ("ministral3", "ministral3", None, []),
    ("ministral3-wrapped-q4", "ministral3", 4, ["--wrapped"]),
    ("gemma4_text", "gemma4_text", None, []),
    ("gemma4-wrapped-q4", "gemma4_text", 4, ["--wrapped"]),
    ("gemma4_text-moe", "gemma4_text", None, ["--moe"]),
    ("gemma4_text-moe-q4", "gemma4_text", 4, ["--moe"]),
    ("qwen3_next", "qwen3_next", None, []),
    ("qwen3_5", "qwen3_5", None, []),
    ("qwen3_5_moe", "qwen3_5", None, ["--moe"]),
    ("lfm2", "lfm2", None, []),
    ("lfm2_moe", "lfm2", None, ["--moe"]),
    ("smollm3", "smollm3", None, []),
    ("smollm3-q4", "smollm3", 4, []),
    ("seed_oss", "seed_oss", None, []),
    ("seed_oss-q8", "seed_oss", 8, []),
    ("olmo3", "olmo3", None, []),
    ("olmo3-q4", "olmo3", 4, []),
    ("glm4_moe", "glm4_moe", None, []),
    ("glm4_moe-per-expert", "glm4_moe", None, ["--per-expert"]),
    ("glm4_moe-q4", "glm4_moe", 4, []),
    ("minimax", "minimax", None, []),
    ("minimax-per-expert", "minimax", None, ["--per-expert"]),
    ("minimax-q4", "minimax", 4, []),
    ("deepseek_v3", "deepseek_v3", None, []),
    ("deepseek_v3-q4", "deepseek_v3", 4, []),
    ("glm4_moe_lite", "glm4_moe_lite", None, []),
    ("glm4_moe_lite-q4", "glm4_moe_lite", 4, []),
    ("granitemoehybrid", "granitemoehybrid", None, []),
    ("granitemoehybrid-hf", "granitemoehybrid", None, ["--per-expert"]),
    ("granitemoehybrid-moe", "granitemoehybrid", None, ["--moe"]),
    ("granitemoehybrid-moe-hf", "granitemoehybrid", None, ["--moe", "--per-expert"]),
    ("granitemoehybrid-moe-q4", "granitemoehybrid", 4, ["--moe"]),
    ("nemotron_h", "nemotron_h", None, []),
    ("nemotron_h-per-expert", "nemotron_h", None, ["--per-expert"]),
    ("nemotron_h-q4", "nemotron_h", 4, []),
]


# Sequences far longer than the windows of the families with local layers, so FastMLX's windowed
# caches drop old keys (twice) during the prompt and the answer, as mlx-lm's rotating caches do.
LONG_PROMPT = [(i * 37 + 11) % 256 for i in range(300)]
LONG_NEW = 300
LONG_MODELS = [
    ("mistral", "mistral", None, []),
    ("gemma3_text", "gemma3_text", None, []),
    ("gpt_oss", "gpt_oss", None, []),
    ("gemma4_text", "gemma4_text", None, []),
    # Past the Mamba-2 scan's 256-position chunks: the state carried from chunk to chunk.
    ("nemotron_h", "nemotron_h", None, []),
]


def greedy(model_dir: Path, prompt=PROMPT, n_new=N_NEW) -> list[int]:
    model, _ = load_model(model_dir)
    steps = generate_step(mx.array(prompt), model, max_tokens=n_new, sampler=lambda x: mx.argmax(x, axis=-1))
    return [int(token) for token, _ in steps]


def make(name, arch, bits, flags, tmp) -> Path:
    out = Path(tmp) / name
    cmd = [str(BINARY), "make-test-model", "--arch", arch, "--seed", str(SEED), str(out)] + flags
    if bits:
        cmd += ["--bits", str(bits)]
    subprocess.run(cmd, check=True)
    return out


def main():
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, arch, bits, flags in MODELS:
            out = make(name, arch, bits, flags, tmp)
            cases.append({"name": name, "arch": arch, "bits": bits, "flags": flags, "output_ids": greedy(out)})
            print(name, cases[-1]["output_ids"])
        long_cases = []
        for name, arch, bits, flags in LONG_MODELS:
            out = make("long-" + name, arch, bits, flags, tmp)
            ids = greedy(out, LONG_PROMPT, LONG_NEW)
            long_cases.append({"name": name, "arch": arch, "bits": bits, "flags": flags, "output_ids": ids})
            print("long", name, ids[:16], "...")
    OUT.write_text(json.dumps({
        "description": "mlx-lm greedy decoding on `fastmlx make-test-model` tiny models (float32, CPU)",
        "regenerate": ".cache/venv/bin/python scripts/reference/tiny_models.py",
        "tool_versions": {p: version(p) for p in ["mlx", "mlx-cpu", "mlx-lm"]},
        "seed": SEED,
        "prompt_ids": PROMPT,
        "cases": cases,
        "long_prompt_ids": LONG_PROMPT,
        "long_cases": long_cases,
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()
