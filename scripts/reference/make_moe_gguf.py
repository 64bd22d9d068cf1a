"""Tiny mixture-of-experts models as llama.cpp's GGUF writes them, with the same weights as a
Hugging Face folder, for tests/gguf_kquants.rs: a Qwen3-MoE ("qwen3moe": every layer routed,
q/k norms, top-k renormalised) and a Qwen2-MoE ("qwen2moe": a gated shared expert, q/k/v biases).
Each expert matrix is stacked (`ffn_gate_exps`, ...) and stored as Q8_0 blocks (gguf-py's
quantizer); the folder holds the same values dequantized, so the two must give equal logits.
Weights are random, built with mlx-lm's own classes; the tokenizer is SmolLM2's (from its GGUF)
for the file and the tiny byte-level one for the folder (the test feeds token ids).

    .cache/venv/bin/python scripts/reference/make_moe_gguf.py TINY_TOKENIZER_DIR OUT_DIR

Writes OUT_DIR/{qwen3moe,qwen2moe}.gguf and OUT_DIR/{qwen3moe,qwen2moe}/ (config.json,
model.safetensors, the tokenizer files of TINY_TOKENIZER_DIR).
"""

import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as T, GGUFReader, GGUFWriter
from gguf.quants import dequantize, quantize
from mlx.utils import tree_flatten
from mlx_lm.models import qwen2_moe, qwen3_moe

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = ROOT / ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 259, 128, 2, 4, 2, 32
EXPERTS, TOP_K, EXPERT_FFN, SHARED_FFN = 8, 4, 64, 128

CONFIGS = {
    "qwen3moe": (qwen3_moe, {"model_type": "qwen3_moe", "head_dim": HEAD_DIM, "decoder_sparse_step": 1,
                             "mlp_only_layers": [], "norm_topk_prob": True, "intermediate_size": 256}),
    "qwen2moe": (qwen2_moe, {"model_type": "qwen2_moe", "shared_expert_intermediate_size": SHARED_FFN,
                             "intermediate_size": 256}),
}

# mlx-lm's names -> llama.cpp's, per layer.
LAYER_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate": "ffn_gate_inp", "mlp.switch_mlp.gate_proj": "ffn_gate_exps",
    "mlp.switch_mlp.up_proj": "ffn_up_exps", "mlp.switch_mlp.down_proj": "ffn_down_exps",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp", "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp", "mlp.shared_expert.down_proj": "ffn_down_shexp",
}


def gguf_name(name):
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if name in top:
        return top[name]
    _, _, layer, rest = name.split(".", 3)
    module, suffix = rest.rsplit(".", 1)
    return f"blk.{layer}.{LAYER_NAMES[module]}.{suffix}"


def main():
    tiny, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    reader = GGUFReader(str(SMOLLM2))
    for arch, (module, extra) in CONFIGS.items():
        config = {"vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
                  "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "rms_norm_eps": 1e-5,
                  "rope_theta": 10000.0, "max_position_embeddings": 2048, "tie_word_embeddings": False,
                  "num_experts": EXPERTS, "num_experts_per_tok": TOP_K, "moe_intermediate_size": EXPERT_FFN,
                  **extra}
        mx.random.seed(5)
        model = module.Model(module.ModelArgs.from_dict(config))
        weights = {}
        for name, value in tree_flatten(model.parameters()):
            # Larger than the default init, so the layers shape the logits.
            value = np.array(value, dtype=np.float32) * (1.0 if "norm" in name else 3.0)
            if "norm" in name:
                value = 1.0 + 0.1 * np.random.default_rng(len(name)).standard_normal(value.shape).astype(np.float32)
            weights[name] = value
        w = GGUFWriter(str(out / f"{arch}.gguf"), arch)
        w.add_context_length(2048)
        w.add_embedding_length(HIDDEN)
        w.add_block_count(LAYERS)
        w.add_feed_forward_length(256)
        w.add_head_count(HEADS)
        w.add_head_count_kv(KV_HEADS)
        w.add_key_length(HEAD_DIM if arch == "qwen3moe" else HIDDEN // HEADS)
        w.add_rope_freq_base(10000.0)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_vocab_size(VOCAB)
        w.add_expert_count(EXPERTS)
        w.add_expert_used_count(TOP_K)
        w.add_expert_feed_forward_length(EXPERT_FFN)
        if arch == "qwen2moe":
            w.add_expert_shared_feed_forward_length(SHARED_FFN)
        for key, field in reader.fields.items():
            if key.startswith("tokenizer.") and key != "tokenizer.chat_template":
                vtype = field.types[0]
                if vtype.name == "ARRAY":
                    w.add_array(key, field.contents())
                elif vtype.name == "STRING":
                    w.add_string(key, field.contents())
                else:
                    w.add_key_value(key, field.contents(), vtype)
        for name, value in weights.items():
            if "_exps" in gguf_name(name) or name.endswith("shared_expert.up_proj.weight"):
                blocks = quantize(value, T.Q8_0)
                weights[name] = dequantize(blocks, T.Q8_0).astype(np.float32).reshape(value.shape)
                w.add_tensor(gguf_name(name), blocks, raw_shape=blocks.shape, raw_dtype=T.Q8_0)
            elif name.endswith("shared_expert_gate.weight"):
                w.add_tensor(gguf_name(name), value.reshape(-1))  # a vector in llama.cpp's files
            else:
                w.add_tensor(gguf_name(name), value)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        folder = out / arch
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(json.dumps({**config, "torch_dtype": "float32"}))
        mx.save_safetensors(str(folder / "model.safetensors"), {k: mx.array(v) for k, v in weights.items()})
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tiny / f, folder / f)
        print("wrote", out / f"{arch}.gguf")


if __name__ == "__main__":
    main()
