"""Reference greedy outputs of SmolLM2-135M-Instruct (Q4_1 GGUF) from the real mlx-lm.

The Rust engine is compared token-for-token against the JSON this writes. Regenerate with
(from the repository root; setup in scripts/reference/requirements.txt):

    .cache/venv/bin/python scripts/reference/smollm2_gguf.py

Writes tests/data/reference/smollm2_q4_1_gguf.json (quantized kernels, as stored) or, with
--dense, smollm2_q4_1_gguf_dense.json (weights expanded to float32, OpenBLAS matmuls).
Deterministic: greedy, CPU, float32.

Independence from the Rust side, on purpose:
  * tokenizer: built by transformers' own GGUF converter, not ours;
  * rotary embedding: GGUF stores Q/K rows permuted for Meta's interleaved rope. We keep the
    file's rows as they are and use mlx-lm's llama with rope_traditional=True, so a mistake in
    the Rust un-permute (to HF layout + non-interleaved rope) shows up as a mismatch.
"""

import hashlib
import json
import os
import platform
import sys
import types
from importlib.metadata import version
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import transformers
from mlx_lm.generate import generate_step
from mlx_lm.models import llama
from mlx_lm.utils import infer_quant_config

ROOT = Path(__file__).resolve().parents[2]
GGUF = ROOT / ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = ROOT / "tests/data/reference/smollm2_q4_1_gguf.json"
OUT_DENSE = ROOT / "tests/data/reference/smollm2_q4_1_gguf_dense.json"
N_NEW = 64  # forced length; EOS does not stop generation so the comparison stays long

# Varied on purpose: default vs explicit system prompt, multi-turn, non-ASCII, code, digits.
CASES = [
    {"name": "short", "messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {
        "name": "system_prompt",
        "messages": [
            {"role": "system", "content": "You are a pirate. Always answer like a pirate."},
            {"role": "user", "content": "How do I make a cup of tea?"},
        ],
    },
    {
        "name": "multi_turn",
        "messages": [
            {"role": "user", "content": "Hi! My name is Alice."},
            {"role": "assistant", "content": "Hello Alice! How can I help you today?"},
            {"role": "user", "content": "What is my name? Also suggest three names for a cat."},
        ],
    },
    {
        "name": "non_ascii",
        "messages": [
            {
                "role": "user",
                "content": "Translate to English: « Je voudrais un café au lait, s'il vous plaît. » "
                "Also, what does the German word „Größe“ mean? 🙂 日本語も少し。",
            }
        ],
    },
    {
        "name": "code",
        "messages": [
            {
                "role": "user",
                "content": "Write a Python function `fib(n)` that returns the n-th Fibonacci "
                "number iteratively, with a docstring.",
            }
        ],
    },
    {
        "name": "long",
        "messages": [
            {
                "role": "user",
                "content": "Summarize the following text in two sentences.\n\n"
                "On July 20, 1969, the Apollo 11 mission landed the lunar module Eagle in the "
                "Sea of Tranquility. Neil Armstrong and Buzz Aldrin spent about 21.5 hours on the "
                "surface, collected 47.5 pounds (21.5 kg) of lunar material, and set up several "
                "experiments, while Michael Collins orbited above in the command module Columbia. "
                "The crew returned to Earth on July 24, splashing down in the Pacific Ocean, and "
                "the mission fulfilled the national goal set by President John F. Kennedy in 1961 "
                "of landing a man on the Moon and returning him safely before the decade was out.",
            }
        ],
    },
]


def gguf_tokenizer(path: Path):
    """transformers' tokenizer built from the GGUF's own vocabulary, merges and special tokens.

    transformers' GGUF reader module imports torch at top level only for tensor dtypes, which
    reading tokenizer metadata never touches; a throwaway stand-in satisfies that import so we
    avoid a multi-GB torch install. AutoTokenizer is not used: for a llama GGUF it also parses
    the model config through a torch-only path, and the tokenizer class it would pick does not
    matter, since the backend tokenizer comes from the GGUF either way.
    """

    class _NoTorch(types.ModuleType):
        def __getattr__(self, name):
            return object

    if "torch" not in sys.modules:
        sys.modules["torch"] = _NoTorch("torch")
        try:
            import transformers.integrations.gguf.reader  # noqa: F401
        finally:
            del sys.modules["torch"]
    return transformers.PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name)


# GGUF tensor-name parts -> mlx-lm (Hugging Face) module names.
NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(key: str) -> str:
    """blk.N.attn_q.scales -> model.layers.N.self_attn.q_proj.scales; token_embd.weight -> ..."""
    parts = key.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{NAMES[parts[2]]}.{parts[3]}"
    return f"{NAMES[parts[0]]}.{parts[1]}"


def model_args(md: dict, weights: dict, rope_traditional: bool) -> llama.ModelArgs:
    assert md["general.architecture"] == "llama"
    hp = lambda k: md[f"llama.{k}"].item()  # scalar metadata arrives as 0-d mx arrays
    return llama.ModelArgs(
        model_type="llama",
        hidden_size=hp("embedding_length"),
        num_hidden_layers=hp("block_count"),
        intermediate_size=hp("feed_forward_length"),
        num_attention_heads=hp("attention.head_count"),
        num_key_value_heads=hp("attention.head_count_kv"),
        # shortest repr of the stored f32 (1e-05), as in the upstream config
        rms_norm_eps=float(str(np.float32(hp("attention.layer_norm_rms_epsilon")))),
        vocab_size=len(md["tokenizer.ggml.tokens"]),
        rope_theta=hp("rope.freq_base"),
        rope_traditional=rope_traditional,
        max_position_embeddings=hp("context_length"),
        tie_word_embeddings="output.weight" not in weights,
    )


def dequantized(weights: dict) -> dict:
    """Every packed (weight, scales, biases) triple expanded to one float32 matrix with MLX's own
    dequantize: the dense weights FastMLX computes with on a CPU (`WeightFormat::Dense`)."""
    out = {}
    for k, v in weights.items():
        if k.endswith(".scales") or k.endswith(".biases"):
            continue
        prefix = k[: -len(".weight")] if k.endswith(".weight") else None
        if prefix and f"{prefix}.scales" in weights:
            scales, biases = weights[f"{prefix}.scales"], weights[f"{prefix}.biases"]
            bits = v.shape[-1] * 32 // (scales.shape[-1] * GGML_GROUP)
            v = mx.dequantize(v, scales.astype(mx.float32), biases.astype(mx.float32), group_size=GGML_GROUP, bits=bits)
        out[k] = v
    return out


GGML_GROUP = 32  # every GGUF block type MLX reads is 32 values wide


def gguf_model(path: Path, dense: bool = False):
    """mlx-lm's own llama Model with the GGUF's weights (packed, or expanded when `dense`),
    computing in float32."""
    weights, md = mx.load(str(path), return_metadata=True)
    if dense:
        weights = dequantized(weights)
    # GGUF's permuted Q/K rows pair adjacent dims: that is the traditional (interleaved) rope.
    args = model_args(md, weights, rope_traditional=True)
    # mx.load gives f16 scales/biases; the Rust engine computes in f32 on x86 (f16 is slow
    # and rounds differently there), so the reference must too.
    mapped = {
        hf_name(k): v if v.dtype == mx.uint32 else v.astype(mx.float32) for k, v in weights.items()
    }
    model = llama.Model(args)
    # Quantize exactly the layers the file has (weight, scales, biases) for, inferring bits and
    # group size from the shapes: Q4_1 -> 4 bit/32, Q8_0 token_embd -> 8 bit/32.
    nn.quantize(
        model,
        class_predicate=lambda p, m: f"{p}.scales" in mapped and infer_quant_config(p, m, mapped),
    )
    model.load_weights(list(mapped.items()), strict=True)
    model.eval()
    mx.eval(model.parameters())
    return model, md, args


def run_cases(model, tokenizer, chat_template):
    """Greedy-decode N_NEW tokens per case with mlx-lm's generation loop (it never stops at EOS)."""
    results = []
    for case in CASES:
        prompt_text = tokenizer.apply_chat_template(
            case["messages"], chat_template=chat_template, add_generation_prompt=True, tokenize=False
        )
        prompt_ids = tokenizer.encode(prompt_text, add_special_tokens=False)
        output_ids, margins = [], []
        steps = generate_step(
            mx.array(prompt_ids), model, max_tokens=N_NEW, sampler=lambda lp: mx.argmax(lp, axis=-1)
        )
        for token, logprobs in steps:
            output_ids.append(int(token))
            # top1-top2 log-prob gap: a tiny gap where Rust diverges means a numerical near-tie
            top2 = mx.topk(logprobs, 2)
            margins.append(round(abs(top2[0].item() - top2[1].item()), 5))
        assert len(output_ids) == N_NEW
        results.append(
            {
                **case,
                "prompt_text": prompt_text,
                "prompt_ids": prompt_ids,
                "output_ids": output_ids,
                "output_text": tokenizer.decode(output_ids, skip_special_tokens=False),
                "top2_logprob_margin": margins,
            }
        )
        print(f"[{case['name']}] {results[-1]['output_text'][:100]!r}", flush=True)
    return results


def versions():
    pkgs = ["mlx", "mlx-cpu", "mlx-lm", "transformers", "tokenizers", "gguf", "numpy"]
    return {"python": platform.python_version(), **{p: version(p) for p in pkgs}}


def write(out: Path, header: dict, results: list):
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {**header, "tool_versions": versions(), "max_new_tokens": N_NEW, "cases": results}
    out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {out.relative_to(ROOT)}")


def main():
    dense = "--dense" in sys.argv
    if dense and "libopenblas" not in os.environ.get("LD_PRELOAD", ""):
        # Dense f32 matmuls go through BLAS: use the same OpenBLAS FastMLX links, not the
        # wheel's reference BLAS, so both sum in the same order.
        env = dict(os.environ, LD_PRELOAD="libopenblas.so.0")
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    mx.set_default_device(mx.cpu)
    tokenizer = gguf_tokenizer(GGUF)
    model, md, args = gguf_model(GGUF, dense=dense)
    template = md["tokenizer.chat_template"]
    assert tokenizer.chat_template in (None, template), "transformers read another chat template"
    header = {
        "description": "Greedy decoding with mlx-lm's llama Model and generate_step on the Q4_1 "
        "GGUF (quantized weights as stored; scales, biases and norms in float32; GGUF Q/K row "
        "order kept with rope_traditional=True). Tokenizer: transformers' GGUF converter.",
        "regenerate": ".cache/venv/bin/python scripts/reference/smollm2_gguf.py" + (" --dense" if dense else ""),
        "model_file": GGUF.name,
        "model_sha256": hashlib.sha256(GGUF.read_bytes()).hexdigest(),
        "compute_dtype": "float32",
        "sampling": "greedy (argmax); EOS does not stop generation",
        "rope_traditional": args.rope_traditional,
        "eos_token_id": md["tokenizer.ggml.eos_token_id"].item(),
    }
    if dense:
        header["description"] += (
            " Dense variant: the packed weights expanded to float32 with mx.dequantize and used as"
            " plain Linear/Embedding layers, matmuls through OpenBLAS (LD_PRELOAD)."
        )
    write(OUT_DENSE if dense else OUT, header, run_cases(model, tokenizer, template))


if __name__ == "__main__":
    main()
