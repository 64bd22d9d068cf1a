"""Small random-weight models for the benchmarks, built with mlx-lm's own classes: a Qwen3-MoE
(8 layers, 32 experts of 256, 4 per token) and a dense Qwen3 of the same active size (an MLP of
4 x 256 = 1024), same attention, same seed for what they share (scripts/bench_moe.sh); a Gemma 3
of 12 layers, 10 of them local with a 512-token window (scripts/bench_window.sh); a Qwen3.5-style
hybrid of 8 layers, 6 Gated DeltaNet and 2 gated attention (scripts/bench_hybrid.sh); a DeepSeek-V3
of 8 dense layers of multi-head latent attention (query rank 256, latent 256, rotary 32, 8 heads of
64 + 32 and values of 64; scripts/bench_mla.sh); a Nemotron-H-style Mamba-2 hybrid of 8 layers, 6 Mamba-2
(16 heads of 64, 2 groups of state 64) and 2 attention, each with a ReLU² MLP (scripts/bench_mamba2.sh).
Float32, saved
as MLX saves models, with SmolLM2's tokenizer (49,152 tokens) so servers can serve them.

    .cache/venv/bin/python scripts/reference/make_bench_models.py OUT_DIR [NAME...]

Writes OUT_DIR/NAME for each name (default: the two Qwen3 models).
"""

import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map, tree_unflatten
from mlx_lm.models import deepseek_v3, gemma3_text, nemotron_h, qwen3, qwen3_5, qwen3_moe
from mlx_lm.utils import save_model

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / ".cache/models/SmolLM2-135M-Instruct-mlx-4bit"
COMMON = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
              rms_norm_eps=1e-6, vocab_size=49152, rope_theta=1e6, max_position_embeddings=8192,
              tie_word_embeddings=False)
MODELS = {
    "qwen3-moe-bench": (qwen3_moe, dict(model_type="qwen3_moe", intermediate_size=1024, num_experts=32,
                                        num_experts_per_tok=4, moe_intermediate_size=256, decoder_sparse_step=1,
                                        mlp_only_layers=[], norm_topk_prob=True)),
    "qwen3-dense-bench": (qwen3, dict(model_type="qwen3", intermediate_size=1024)),
    "gemma3-window-bench": (gemma3_text, dict(model_type="gemma3_text", num_hidden_layers=12, intermediate_size=1024,
                                              query_pre_attn_scalar=64, rope_local_base_freq=10000.0,
                                              sliding_window=512, sliding_window_pattern=6)),
    "qwen3_5-hybrid-bench": (qwen3_5, dict(model_type="qwen3_5", intermediate_size=1024, full_attention_interval=4,
                                            linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64,
                                            linear_value_head_dim=64, linear_conv_kernel_dim=4, num_experts=0,
                                            rope_parameters={"rope_type": "default", "rope_theta": 100000.0,
                                                             "partial_rotary_factor": 0.25})),
    "deepseek-v3-mla-bench": (deepseek_v3, dict(model_type="deepseek_v3", intermediate_size=1024, q_lora_rank=256,
                                                kv_lora_rank=256, qk_rope_head_dim=32, qk_nope_head_dim=64,
                                                v_head_dim=64)),
    "nemotron-h-mamba2-bench": (nemotron_h, dict(model_type="nemotron_h", intermediate_size=1024,
                                                 hybrid_override_pattern="M-M-M-*-M-M-M-*-", mamba_num_heads=16,
                                                 mamba_head_dim=64, n_groups=2, ssm_state_size=64, conv_kernel=4,
                                                 mamba_proj_bias=False, use_conv_bias=True, attention_bias=False,
                                                 mlp_bias=False, use_bias=False, layer_norm_epsilon=1e-6)),
}
DEFAULT = ["qwen3-moe-bench", "qwen3-dense-bench"]


def build(module, config, out):
    args = module.ModelArgs.from_dict(config)
    model = module.Model(args)
    mx.random.seed(3)
    # Small random weights (a trained model's scale), norms at 1.
    params = tree_map(lambda p: mx.random.normal(p.shape, dtype=mx.float32) * 0.02, model.parameters())
    model.update(params)
    norms = [(n, mx.ones(p.shape)) for n, p in tree_flatten(model.parameters()) if n.endswith("norm.weight")]
    model.update(tree_unflatten(norms))
    mx.eval(model.parameters())
    out.mkdir(parents=True, exist_ok=True)
    save_model(out, model)
    (out / "config.json").write_text(json.dumps({**config, "torch_dtype": "float32"}, indent=1))
    for name in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"]:
        shutil.copy(TOKENIZER / name, out / name)


def main():
    root = Path(sys.argv[1])
    for name in sys.argv[2:] or DEFAULT:
        module, extra = MODELS[name]
        build(module, {**COMMON, **extra}, root / name)
        print("wrote", root / name)


if __name__ == "__main__":
    main()
