"""Greedy tokens of tiny random Qwen3-VL, Qwen3-VL-MoE and Qwen3.5 models (issue 36) from mlx-vlm 0.7.6's own
`qwen3_vl` / `qwen3_vl_moe` / `qwen3_5` `Model` and `generate_step`: one image, two images in one message, a
tall and a wide image, an image in the second turn, and text alone. Writes each model folder in
the mlx-community layout (`language_model.*`, `vision_tower.*`, the outer config with
`text_config` and `vision_config`, `preprocessor_config.json` with 8-pixel patches, a byte-level
tokenizer with Qwen's vision tokens and a Qwen-VL-shaped chat template) to
tests/data/vision/tiny_<family>/ and the prompts, grids and tokens to
tests/data/reference/vision_<family>_generate.json.

Regenerate (from the repository root):

    .cache/venv/bin/python scripts/reference/vision_qwen3_vl_generate.py [qwen3_vl|qwen3_vl_moe|qwen3_5]
"""

import importlib
import json
import pathlib
import sys
from importlib.metadata import version

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from PIL import Image

from mlx_vlm.generate.ar import generate_step
from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import Qwen3VLImageProcessor, _to_numpy_image

ROOT = pathlib.Path(__file__).resolve().parents[2]
IMAGES = ROOT / "tests/data/vision"

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
           "<|video_pad|>"]
EOT, IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = range(256, 256 + len(SPECIAL))

TEXT = {
    "model_type": "qwen3_vl_text", "num_hidden_layers": 3, "hidden_size": 32, "intermediate_size": 64,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6, "vocab_size": 264,
    "rope_theta": 5000.0, "max_position_embeddings": 4096, "tie_word_embeddings": False,
    "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True},
}
VISION = {
    "model_type": "qwen3_vl", "depth": 2, "hidden_size": 16, "intermediate_size": 32, "out_hidden_size": 32,
    "num_heads": 2, "patch_size": 8, "temporal_patch_size": 2, "spatial_merge_size": 2, "in_channels": 3,
    "num_position_embeddings": 64, "deepstack_visual_indexes": [0, 1],
}
# Qwen3.5: the hybrid (Gated DeltaNet layers, every second one full attention with a gated
# output and partial rotary), the same tower without deepstack.
TEXT_3_5 = {
    "model_type": "qwen3_5_text", "num_hidden_layers": 4, "hidden_size": 32, "intermediate_size": 64,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6, "vocab_size": 264,
    "max_position_embeddings": 4096, "tie_word_embeddings": False, "full_attention_interval": 2,
    "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "rope_parameters": {"rope_type": "default", "mrope_section": [2, 1, 1], "mrope_interleaved": True,
                        "rope_theta": 5000.0, "partial_rotary_factor": 0.5},
}
# Qwen3-VL-MoE: Qwen3-VL's attention with routed experts (every layer but the first).
TEXT_VL_MOE = {**TEXT, "model_type": "qwen3_vl_moe_text", "num_experts": 4, "num_experts_per_tok": 2,
               "decoder_sparse_step": 1, "mlp_only_layers": [0], "moe_intermediate_size": 16, "norm_topk_prob": True}
FAMILIES = {
    "qwen3_vl": ("Qwen3VLForConditionalGeneration", TEXT, VISION),
    "qwen3_vl_moe": ("Qwen3VLMoeForConditionalGeneration", TEXT_VL_MOE, {**VISION, "model_type": "qwen3_vl_moe"}),
    "qwen3_5": ("Qwen3_5ForConditionalGeneration", TEXT_3_5, {**VISION, "model_type": "qwen3_5",
                                                               "deepstack_visual_indexes": []}),
}


def outer_config(family):
    architecture, text, vision = FAMILIES[family]
    return {
        "model_type": family, "architectures": [architecture], "text_config": text, "vision_config": vision,
        "image_token_id": IMAGE_PAD, "video_token_id": VIDEO_PAD, "vision_start_token_id": VISION_START,
        "vision_end_token_id": VISION_END, "vocab_size": 264, "tie_word_embeddings": False,
        "eos_token_id": [IM_END, EOT],
    }
PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": 8, "temporal_patch_size": 2, "merge_size": 2,
    "size": {"shortest_edge": 1024, "longest_edge": 65536}, "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
# Qwen3-VL's template reduced to what the tests render: ChatML, an image part as the vision span.
TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
N_NEW = 12


def byte_alphabet():
    """GPT-2's printable stand-ins for the 256 bytes (FastMLX's test tokenizers use the same)."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    extra, out = 0, []
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            extra += 1
            out.append(chr(255 + extra))
    return out


def tokenizer_json():
    vocab = {c: i for i, c in enumerate(byte_alphabet())}
    added = [{"id": 256 + k, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for k, t in enumerate(SPECIAL)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def text(s):
    return list(s.encode())


def turn(role, *parts):
    """A ChatML message; an image part is the name of a file (its pad not yet expanded)."""
    ids = [IM_START] + text(role + "\n")
    for p in parts:
        ids += [VISION_START, IMAGE_PAD, VISION_END] if p.endswith((".png", ".gif", ".jpg")) else text(p)
    return ids + [IM_END] + text("\n")


def random_like(name, v):
    """Random weights that keep a tiny model's answers varied: norms near one, matrices scaled by
    their fan-in (unit-scale weights saturate it into repeating one token)."""
    if v.ndim == 1 and "norm" in name:
        return 1.0 + 0.2 * mx.random.normal(v.shape)
    if v.ndim == 1:
        return 0.1 * mx.random.normal(v.shape)
    fan_in = int(np.prod(v.shape[1:]))
    return mx.random.normal(v.shape) * (1.5 / fan_in**0.5)


def main():
    family = sys.argv[1] if len(sys.argv) > 1 else "qwen3_vl"
    package = importlib.import_module(f"mlx_vlm.models.{family}.{family}")
    configs = importlib.import_module(f"mlx_vlm.models.{family}.config")
    outer = outer_config(family)
    _, text, vision = FAMILIES[family]
    out = ROOT / f"tests/data/vision/tiny_{family}"
    mx.random.seed(3613)
    config = configs.ModelConfig.from_dict(json.loads(json.dumps(outer)))
    config.text_config = configs.TextConfig(**json.loads(json.dumps(text)))
    config.vision_config = configs.VisionConfig(**vision)
    model = package.Model(config)
    params = {k: random_like(k, v) for k, v in tree_flatten(model.parameters())}
    model.load_weights(list(params.items()))
    model.eval()

    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), params, metadata={"format": "mlx"})
    write = lambda name, value: (out / name).write_text(json.dumps(value, indent=1) + "\n")
    write("config.json", outer)
    write("preprocessor_config.json", PREPROCESSOR)
    write("tokenizer.json", tokenizer_json())
    write("tokenizer_config.json", {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                    "chat_template": TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast"})
    write("generation_config.json", {"eos_token_id": [IM_END, EOT]})

    proc = Qwen3VLImageProcessor(patch_size=8, temporal_patch_size=2, merge_size=2, min_pixels=1024,
                                 max_pixels=65536, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    out_cases = []
    for name, (ids, images) in cases_with_names():
        pixels, grids = [], []
        for image in images:
            values, grid = proc._process_one(_to_numpy_image(Image.open(IMAGES / image)))
            pixels.append(values)
            grids.append(list(grid))
        expanded = []
        k = 0
        for t in ids:
            if t == IMAGE_PAD:
                g = grids[k]
                expanded += [IMAGE_PAD] * (g[0] * g[1] * g[2] // 4)
                k += 1
            else:
                expanded.append(t)
        kwargs = {}
        pixel_values = None
        if images:
            pixel_values = mx.array(np.concatenate(pixels))
            kwargs["image_grid_thw"] = mx.array(grids)
        steps = generate_step(mx.array([expanded]), model, pixel_values, None, max_tokens=N_NEW,
                              sampler=lambda x: mx.argmax(x, axis=-1), **kwargs)
        output = [int(t) for t, _ in steps]
        out_cases.append({"name": name, "images": images, "grids": grids, "prompt_ids": ids,
                          "expanded_ids": expanded, "output_ids": output})
        print(name, len(expanded), grids, output)
    (ROOT / f"tests/data/reference/vision_{family}_generate.json").write_text(json.dumps({
        "description": f"mlx-vlm generate_step, greedy, on tests/data/vision/tiny_{family} (float32, CPU)",
        "regenerate": f".cache/venv/bin/python scripts/reference/vision_qwen3_vl_generate.py {family}",
        "tool_versions": {p: version(p) for p in ["mlx", "mlx-vlm", "Pillow"]},
        "cases": out_cases,
    }) + "\n")


def cases_with_names():
    """Each case's unexpanded prompt ids and its images in order."""
    answer = [IM_START] + text("assistant\n")
    specs = [
        ("one image", [("user", ["small.png", "What is this?"])]),
        ("two images", [("user", ["small.png", "banner.gif", "Compare them."])]),
        ("tall image", [("user", ["Read the page: ", "tall.png"])]),
        ("wide image", [("user", ["wide.jpg", "Describe."])]),
        ("image in the second turn", [("user", ["Hello there, how are you today?"]), ("assistant", ["Fine."]),
                                      ("user", ["Now look at ", "banner.gif", " and say what it shows."])]),
        ("text only", [("user", ["No pictures here, just words."])]),
    ]
    for name, turns in specs:
        ids, images = [], []
        for role, parts in turns:
            ids += turn(role, *parts)
            images += [p for p in parts if p.endswith((".png", ".gif", ".jpg"))]
        yield name, (ids + answer, images)


if __name__ == "__main__":
    main()
