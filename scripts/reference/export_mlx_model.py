"""Export the SmolLM2 Q4_1 GGUF as an mlx-community style 4-bit MLX model directory.

Gives the Rust engine an MLX-layout model (config.json + model.safetensors + tokenizer files)
without Hugging Face hub access, made with mlx-lm's own quantize/save code. Regenerate with
(from the repository root):

    .cache/venv/bin/python scripts/reference/export_mlx_model.py [OUT_DIR]

OUT_DIR defaults to .cache/models/SmolLM2-135M-Instruct-mlx-4bit. Byte-identical on re-runs.

GGUF Q4_1/Q8_0 -> float32 -> Hugging Face row order -> mlx_lm quantize (4 bit, group 64).
Non-quantized parameters (norms) and the quantization scales/biases are float32, unlike
mlx-community's bf16, so that comparisons against the Rust engine are float32 end to end.
"""

import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm.models import llama
from mlx_lm.utils import quantize_model, save_config, save_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from smollm2_gguf import GGUF, ROOT, gguf_tokenizer, hf_name, model_args  # noqa: E402

DEFAULT_OUT = ROOT / ".cache/models/SmolLM2-135M-Instruct-mlx-4bit"
DEFAULT_OUT_F32 = ROOT / ".cache/models/SmolLM2-135M-Instruct-mlx-f32"
GGML_BLOCK = 32  # QK4_1 == QK8_0 == 32 values per block, i.e. MLX group size


def unpermute(w: mx.array, n_heads: int) -> mx.array:
    """Undo llama.cpp's convert-time Q/K row permutation (HF -> interleaved-rope order).

    llama.cpp: w.reshape(H, 2, d/2, C).swapaxes(1, 2); so GGUF row 2i (2i+1) of a head is HF
    row i (i + d/2). HF layout needs the non-interleaved rope that mlx-lm uses by default.
    """
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def float_weights(args: llama.ModelArgs, raw: dict) -> dict:
    """All GGUF tensors dequantized to float32, under HF names and in HF row order."""
    out = {}
    for key in raw:
        base, kind = key.rsplit(".", 1)
        if kind in ("scales", "biases"):
            continue
        w = raw[key]
        if w.dtype == mx.uint32:
            scales = raw[f"{base}.scales"].astype(mx.float32)
            biases = raw[f"{base}.biases"].astype(mx.float32)
            bits = w.shape[-1] * 32 // (scales.shape[-1] * GGML_BLOCK)
            w = mx.dequantize(w, scales, biases, group_size=GGML_BLOCK, bits=bits)
        w = w.astype(mx.float32)
        if base.endswith("attn_q"):
            w = unpermute(w, args.num_attention_heads)
        elif base.endswith("attn_k"):
            w = unpermute(w, args.num_key_value_heads)
        out[hf_name(key)] = w
    return out


def main():
    # --f32: no re-quantization, the float32 expansion of the GGUF (the "f32 conversion" the
    # server benchmark runs mlx-lm on).
    f32 = "--f32" in sys.argv
    paths = [a for a in sys.argv[1:] if not a.startswith("--")]
    out_dir = Path(paths[0]) if paths else (DEFAULT_OUT_F32 if f32 else DEFAULT_OUT)
    mx.set_default_device(mx.cpu)
    raw, md = mx.load(str(GGUF), return_metadata=True)
    args = model_args(md, raw, rope_traditional=False)  # HF layout: non-interleaved rope
    model = llama.Model(args)
    model.load_weights(list(float_weights(args, raw).items()), strict=True)

    token = lambda key: md[f"tokenizer.ggml.{key}_token_id"].item()
    tokens = md["tokenizer.ggml.tokens"]
    # Upstream-style config.json (hf LlamaForCausalLM keys), float32 instead of bf16.
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": args.hidden_size,
        "intermediate_size": args.intermediate_size,
        "num_hidden_layers": args.num_hidden_layers,
        "num_attention_heads": args.num_attention_heads,
        "num_key_value_heads": args.num_key_value_heads,
        "head_dim": args.hidden_size // args.num_attention_heads,
        "rms_norm_eps": args.rms_norm_eps,
        "rope_theta": args.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": args.max_position_embeddings,
        "vocab_size": args.vocab_size,
        "tie_word_embeddings": args.tie_word_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": token("bos"),
        "eos_token_id": token("eos"),
        "pad_token_id": token("padding"),
        "torch_dtype": "float32",
    }
    # mlx-lm's own quantizer, as mlx_lm.convert -q uses; adds "quantization"(+"_config").
    if not f32:
        model, config = quantize_model(model, config, group_size=64, bits=4)

    out_dir.mkdir(parents=True, exist_ok=True)
    save_model(out_dir, model)  # model.safetensors + model.safetensors.index.json
    save_config(config, out_dir / "config.json")

    tokenizer = gguf_tokenizer(GGUF)
    tokenizer.backend_tokenizer.save(str(out_dir / "tokenizer.json"))
    special = {
        "bos_token": tokens[token("bos")],
        "eos_token": tokens[token("eos")],
        "pad_token": tokens[token("padding")],
        "unk_token": tokens[token("unknown")],
    }
    added = json.loads(tokenizer.backend_tokenizer.to_str())["added_tokens"]
    # Written by hand rather than save_pretrained: transformers 5 puts the chat template in a
    # separate .jinja file and records its own loader state (is_local, TokenizersBackend).
    tokenizer_config = {
        "add_bos_token": bool(md["tokenizer.ggml.add_bos_token"].item()),
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
            for t in added
        },
        **special,
        "chat_template": md["tokenizer.chat_template"],
        "clean_up_tokenization_spaces": False,
        "model_max_length": args.max_position_embeddings,
        "tokenizer_class": "GPT2Tokenizer",
        "vocab_size": args.vocab_size,
    }
    generation_config = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    for name, obj in [
        ("tokenizer_config.json", tokenizer_config),
        ("special_tokens_map.json", special),
        ("generation_config.json", generation_config),
    ]:
        (out_dir / name).write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {out_dir}")


if __name__ == "__main__":
    main()
