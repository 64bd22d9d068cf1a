"""Greedy tokens of tiny random Gemma 3 and Gemma 4 models with images in, from mlx-vlm 0.7.6's own
`gemma3` / `gemma4` `Model`, under two semantics: transformers 5.24's (`output_ids`, what FastMLX
follows) and mlx-vlm's as it is (`output_ids_mlx_vlm`, its `generate_step` unpatched). Same six
cases as vision_qwen3_vl_generate.py: one image, two images in one message, a tall and a wide
image, an image in the second turn, and text alone.

Writes the model folder in the mlx-community layout to tests/data/vision/tiny_<family>/
(`config.json` with `text_config` and `vision_config`, `model.safetensors` holding
`tree_flatten(model.parameters())` of mlx-vlm's `Model` with random weights, a byte-level
tokenizer with the family's special tokens and a reduced chat template of the family's shape,
`generation_config.json` and the processor files), and the prompts, ids, tokens and the image
features that reach the language model to tests/data/reference/vision_<family>_generate.json.

How transformers' semantics are had from mlx-vlm here (see docs/research/gemma-vision.md §0, §5):
- Gemma 3, attention: transformers lets the soft tokens of one image see each other in the
  prefill: full layers (causal OR same-image), sliding layers ((causal OR same-image) AND
  kv > q - sliding_window); decode steps are plain causal. mlx-vlm's Gemma 3 is causal only.
  Patched: `mlx_vlm.models.gemma3.language.create_attention_mask` (the name Gemma3Model calls)
  returns those two masks for the one-forward prefill of the whole prompt (window_size None: the
  full mask; given: the sliding one) and is mlx-vlm's own for the decode steps.
- Gemma 3, SigLIP `post_layernorm` eps: transformers `layer_norm_eps` (1e-6), mlx-vlm's
  `nn.LayerNorm` default (1e-5). Patched: the module's `eps` attribute is set to 1e-6.
- Gemma 3, image feature scale: mlx-vlm divides the projected features by sqrt(top-level
  `hidden_size`) and the language model multiplies every row by bf16(sqrt(text hidden)); the
  top-level `hidden_size` is 64 here, equal to the text hidden size, so the two cancel exactly
  (÷8, ×8) and nothing is patched.
- Gemma 4 (`use_bidirectional_attention: "vision"`): transformers puts the same-image overlay on
  the sliding layers only ((causal OR same-image) AND window), the full layers stay causal;
  mlx-vlm puts it on both, OR-ed after the window. Patched: `Gemma4TextModel._make_masks` (on
  the instance) returns those masks for the prefill and is mlx-vlm's own for the decode steps.
The transformers-semantics prefill is one forward of the whole prompt from an empty cache, then
one token per step, greedy. A "same-image block" is the run of one image's soft tokens (boi/eoi
are text). Everything is float32 on the CPU.

Regenerate (from the repository root):

    .cache/venv/bin/python scripts/reference/vision_gemma_generate.py [gemma3|gemma4]
"""

import json
import math
import pathlib
import sys
from importlib.metadata import version

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from PIL import Image

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from vision_qwen3_vl_generate import byte_alphabet  # noqa: E402

from mlx_vlm.generate.ar import generate_step  # noqa: E402
from mlx_vlm.models.cache import create_causal_mask  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
IMAGES = ROOT / "tests/data/vision"
N_NEW = 12
IMAGE_FILES = (".png", ".gif", ".jpg")

# ---------------------------------------------------------------------------------------------
# Gemma 3
G3_SPECIAL = ["<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
              "<image_soft_token>"]
G3 = dict(zip(["eos", "bos", "start_of_turn", "end_of_turn", "boi", "eoi", "image"],
              range(256, 256 + len(G3_SPECIAL))))
G3_VOCAB = 264  # 256 bytes + 7 specials, rounded up to a multiple of 8
G3_MM_TOKENS = 16
G3_TEXT = {
    "model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "query_pre_attn_scalar": 16,
    "sliding_window": 8, "sliding_window_pattern": 2,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    "rope_local_base_freq": 10000.0, "rope_theta": 1000000.0, "rope_scaling": None, "rms_norm_eps": 1e-6,
    "vocab_size": G3_VOCAB, "max_position_embeddings": 4096, "hidden_activation": "gelu_pytorch_tanh",
    "final_logit_softcapping": None, "attn_logit_softcapping": None, "mm_tokens_per_image": G3_MM_TOKENS,
    "pad_token_id": 0, "tie_word_embeddings": True,
}
G3_VISION = {
    "model_type": "siglip_vision_model", "image_size": 32, "patch_size": 4, "hidden_size": 32,
    "intermediate_size": 64, "num_attention_heads": 2, "num_hidden_layers": 2, "layer_norm_eps": 1e-6,
    "num_channels": 3, "vision_use_head": False, "hidden_act": "gelu_pytorch_tanh",
}
G3_OUTER = {
    "model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
    "text_config": G3_TEXT, "vision_config": G3_VISION,
    # mlx-vlm divides the image features by sqrt(this); equal to the text hidden size it cancels.
    "hidden_size": 64,
    "image_token_index": G3["image"], "boi_token_index": G3["boi"], "eoi_token_index": G3["eoi"],
    "mm_tokens_per_image": G3_MM_TOKENS, "pad_token_id": 0, "vocab_size": G3_VOCAB,
    "eos_token_id": [G3["eos"], G3["end_of_turn"]], "tie_word_embeddings": True,
}
# Gemma 3's template (tests/data/chat_templates/gemma3.jinja) reduced to what the tests render:
# BOS, turns, assistant -> model, text parts trimmed, an image part as <start_of_image>.
G3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "<start_of_turn>{{ role }}\n"
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' or item['type'] == 'image_url' %}<start_of_image>"
    "{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

# ---------------------------------------------------------------------------------------------
# Gemma 4
G4_SPECIAL = ["<eos>", "<bos>", "<|turn>", "<turn|>", "<|image>", "<|image|>", "<image|>", "<|audio>",
              "<|audio|>", "<audio|>", "<|video|>", "<|channel>", "<channel|>"]
G4 = dict(zip(["eos", "bos", "turn_start", "turn_end", "boi", "image", "eoi", "boa", "audio", "eoa", "video",
               "channel_start", "channel_end"], range(256, 256 + len(G4_SPECIAL))))
G4_VOCAB = 272  # 256 bytes + 13 specials, rounded up to a multiple of 8
G4_MAX_SOFT_TOKENS = 16
G4_TEXT = {
    "model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32,
    "num_global_key_value_heads": None, "attention_k_eq_v": False,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    "sliding_window": 8,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
    },
    "num_kv_shared_layers": 0, "use_double_wide_mlp": True,
    "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": G4_VOCAB, "vocab_size": G4_VOCAB,
    "use_bidirectional_attention": "vision", "final_logit_softcapping": 30.0, "enable_moe_block": False,
    "num_experts": None, "top_k_experts": None, "moe_intermediate_size": None,
    "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "hidden_activation": "gelu_pytorch_tanh",
    "pad_token_id": 0, "bos_token_id": G4["bos"], "eos_token_id": G4["eos"], "tie_word_embeddings": True,
}
G4_VISION = {
    "model_type": "gemma4_vision", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 16,
    "patch_size": 4, "pooling_kernel_size": 3, "position_embedding_size": 64,
    "default_output_length": G4_MAX_SOFT_TOKENS, "rope_parameters": {"rope_type": "default", "rope_theta": 100.0},
    "standardize": True, "use_clipped_linears": True, "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh", "attention_bias": False,
}
G4_OUTER = {
    "model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"],
    "text_config": G4_TEXT, "vision_config": G4_VISION, "audio_config": None,
    "image_token_id": G4["image"], "boi_token_id": G4["boi"], "eoi_token_id": G4["eoi"],
    "audio_token_id": G4["audio"], "boa_token_id": G4["boa"], "eoa_token_id": G4["eoa"],
    "eoa_token_index": G4["eoa"], "video_token_id": G4["video"],
    "vision_soft_tokens_per_image": G4_MAX_SOFT_TOKENS, "pad_token_id": 0, "vocab_size": G4_VOCAB,
    "eos_token_id": [G4["eos"], G4["turn_end"]], "tie_word_embeddings": True,
}
# Gemma 4's template (tests/data/chat_templates/gemma4.jinja) reduced: BOS, <|turn>role ... <turn|>,
# assistant -> model, text trimmed, an image part as "\n\n<|image|>\n\n", and the generation prompt
# with the empty thought channel the real one adds when thinking is off.
# Text that follows a block tag and starts with a newline is written as a string expression, as in
# the real template: transformers renders with trim_blocks, which drops the first newline after a tag.
G4_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "<|turn>{{ role }}\n"
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' or item['type'] == 'image_url' %}{{ '\\n\\n<|image|>\\n\\n' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}"
    "{% endfor %}{% endif %}<turn|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|turn>model\n<|channel>thought\n<channel|>{% endif %}"
)

SEEDS = {"gemma3": 13, "gemma4": 14}  # chosen: every image case tells the semantics apart, greedy leads > 0.0025


# ---------------------------------------------------------------------------------------------
def tokenizer_json(special):
    vocab = {c: i for i, c in enumerate(byte_alphabet())}
    added = [{"id": 256 + k, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for k, t in enumerate(special)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def random_like(family, name, v):
    """Random weights that keep a tiny model's answers varied: norms near one (Gemma 3's text and
    projector norms scale by 1 + w, so theirs near zero), matrices scaled by their fan-in. With
    the head tied to the embeddings, a stream that the embedding dominates repeats the last input
    token: so small embeddings (0.05, times sqrt(64) = 0.4 in the stream) and the text blocks'
    post-norms near two, so that every layer moves the stream."""
    n = lambda: mx.random.normal(v.shape)
    last = name.rsplit(".", 1)[-1]
    one_plus_w = family == "gemma3" and (name.startswith("language_model.") or "mm_soft_emb_norm" in name)
    if last == "weight" and name.endswith("embed_tokens.weight"):
        return 0.05 * n()
    if "norm" in name and last == "weight":
        boost = 1.0 if name.startswith("language_model.") and ".post_" in name else 0.0
        return (0.0 if one_plus_w else 1.0) + boost + 0.2 * n()
    if last == "layer_scalar":
        return 0.8 + 0.1 * n()
    if last == "std_scale":
        return 1.0 + 0.2 * n()
    if last == "std_bias":
        return 0.5 * n()
    if last == "position_embedding_table":
        return 0.5 * n()
    if last == "mm_input_projection_weight":  # [vision hidden, text hidden]: in x out
        return n() * (1.5 / v.shape[0] ** 0.5)
    if v.ndim == 1:
        return 0.1 * n()
    fan_in = int(np.prod(v.shape[1:]))
    return n() * (1.5 / fan_in**0.5)


def rgb(name):
    """The image as mlx-vlm's pipeline hands it to the processor (`process_image`: convert("RGB"),
    which drops an alpha channel rather than compositing it)."""
    img = Image.open(IMAGES / name)
    return img.convert("RGB") if img.mode != "RGB" else img


def specs():
    return [
        ("one image", [("user", ["small.png", "What is this?"])]),
        ("two images", [("user", ["small.png", "banner.gif", "Compare them."])]),
        ("tall image", [("user", ["Read the page: ", "tall.png"])]),
        ("wide image", [("user", ["wide.jpg", "Describe."])]),
        ("image in the second turn", [("user", ["Hello there, how are you today?"]), ("assistant", ["Fine."]),
                                      ("user", ["Now look at ", "banner.gif", " and say what it shows."])]),
        ("text only", [("user", ["No pictures here, just words."])]),
    ]


def openai_messages(turns):
    """OpenAI chat messages: a turn with an image as a list of parts, else a string."""
    out = []
    for role, parts in turns:
        if any(p.endswith(IMAGE_FILES) for p in parts):
            content = [{"type": "image_url", "image_url": {"url": p}} if p.endswith(IMAGE_FILES)
                       else {"type": "text", "text": p} for p in parts]
        else:
            content = "".join(parts)
        out.append({"role": role, "content": content})
    return out


def template_messages(messages):
    """What FastMLX hands the template: image_url parts as {"type": "image"}."""
    out = []
    for m in messages:
        c = m["content"]
        if not isinstance(c, str):
            c = [{"type": "image"} if p["type"] == "image_url" else p for p in c]
        out.append({"role": m["role"], "content": c})
    return out


def block_ids(ids, image_id):
    """transformers' block_sequence_ids: each run of image soft tokens numbered, text -1."""
    out, group, prev = [], -1, False
    for t in ids:
        is_img = t == image_id
        if is_img and not prev:
            group += 1
        out.append(group if is_img else -1)
        prev = is_img
    return np.array(out)


def hf_masks(ids, image_id, window, overlay_full):
    """transformers' prefill masks (from an empty cache), [1, 1, L, L] bool:
    full = causal (OR same-image if overlay_full), sliding = (causal OR same-image) AND kv > q - window."""
    b = block_ids(ids, image_id)
    L = len(ids)
    q = np.arange(L)[:, None]
    k = np.arange(L)[None, :]
    causal = k <= q
    same = (b[:, None] == b[None, :]) & (b[:, None] >= 0)
    full = (causal | same) if overlay_full else causal
    sliding = (causal | same) & (k > q - window)
    return mx.array(full[None, None]), mx.array(sliding[None, None])


def stats(features):
    f = np.array(features, dtype=np.float64)
    return {"shape": list(f.shape), "row_sums": [float(x) for x in f.sum(-1)[:8]],
            "first": [float(x) for x in f.reshape(-1)[:8]], "abs_sum": float(np.abs(f).sum())}


# ---------------------------------------------------------------------------------------------
class Gemma3:
    name = "gemma3"
    outer, text, vision = G3_OUTER, G3_TEXT, G3_VISION
    special, ids, template = G3_SPECIAL, G3, G3_TEMPLATE

    def __init__(self):
        from mlx_vlm.models import gemma3
        from mlx_vlm.models.gemma3 import language
        self.pkg, self.language = gemma3, language

    def build(self):
        g = self.pkg
        config = g.ModelConfig.from_dict(json.loads(json.dumps(self.outer)))
        config.text_config = g.TextConfig.from_dict(self.text)
        config.vision_config = g.VisionConfig.from_dict(self.vision)
        return g.Model(config)

    def tie(self, params):
        # mlx-vlm's sanitize always ties the head (it looks for a bare "lm_head.weight"), and so
        # does transformers: the saved head equals the embeddings, whichever way a reader goes.
        params["language_model.lm_head.weight"] = params["language_model.model.embed_tokens.weight"]

    def processor_files(self):
        size = self.vision["image_size"]
        return {
            "preprocessor_config.json": {
                "image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor",
                "size": {"height": size, "width": size}, "resample": 2, "do_resize": True, "do_rescale": True,
                "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5] * 3,
                "image_std": [0.5] * 3, "do_convert_rgb": None, "image_seq_length": G3_MM_TOKENS,
                "do_pan_and_scan": None, "pan_and_scan_max_num_crops": None,
                "pan_and_scan_min_crop_size": None, "pan_and_scan_min_ratio_to_activate": None,
            },
            "processor_config.json": {"image_seq_length": G3_MM_TOKENS, "processor_class": "Gemma3Processor"},
        }

    def extra_special(self):
        return {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}

    def load_processor(self, path):
        from mlx_vlm.models.gemma3.processing_gemma3 import Gemma3Processor
        return Gemma3Processor.from_pretrained(str(path))

    def expand(self, tokenizer, prompt_text, images, proc_out):
        full = "\n\n<start_of_image>" + "<image_soft_token>" * G3_MM_TOKENS + "<end_of_image>\n\n"
        text = prompt_text.replace("<start_of_image>", full) if images else prompt_text
        return text, tokenizer.encode(text, add_special_tokens=False), [G3_MM_TOKENS] * len(images)

    def set_hf_tower(self, model, hf):
        model.vision_tower.vision_model.post_layernorm.eps = 1e-6 if hf else 1e-5

    def features(self, model, pixel_values):
        hidden, _, _ = model.vision_tower(pixel_values.transpose(0, 2, 3, 1), output_hidden_states=True)
        return model.multi_modal_projector(hidden)

    def mlx_vlm_tokens(self, model, expanded, proc_out, n_images):
        pv = None
        mask = None
        if n_images:
            # mlx-vlm's get_input_embeddings wants the attention mask (it builds a 4D mask from it
            # that the language model then ignores).
            pv = proc_out["pixel_values"]
            mask = mx.ones((1, len(expanded)), dtype=mx.int32)
        steps = generate_step(mx.array([expanded]), model, pv, mask, max_tokens=N_NEW,
                              sampler=lambda x: mx.argmax(x, axis=-1))
        return tokens_and_gap(steps)

    def hf_tokens(self, model, expanded, proc_out, n_images):
        ids = mx.array([expanded])
        if n_images:
            emb = model.get_input_embeddings(ids, proc_out["pixel_values"],
                                             mask=mx.ones((1, len(expanded)), dtype=mx.int32)).inputs_embeds
        else:
            emb = model.get_input_embeddings(ids, None).inputs_embeds
        full, sliding = hf_masks(expanded, self.ids["image"], self.text["sliding_window"], overlay_full=True)
        cache = model.language_model.make_cache()
        original = self.language.create_attention_mask

        def prefill_mask(h, c=None, window_size=None, return_array=False):
            # PATCH (Gemma 3, transformers' prefill masks): see the module docstring.
            assert h.shape[1] == len(expanded) and (c is None or c.offset == 0)
            return sliding if window_size else full

        self.language.create_attention_mask = prefill_mask
        try:
            logits = model.language_model(ids, inputs_embeds=emb, cache=cache).logits
        finally:
            self.language.create_attention_mask = original
        return greedy_decode(model, logits, cache)


class Gemma4:
    name = "gemma4"
    outer, text, vision = G4_OUTER, G4_TEXT, G4_VISION
    special, ids, template = G4_SPECIAL, G4, G4_TEMPLATE

    def __init__(self):
        from mlx_vlm.models import gemma4
        self.pkg = gemma4

    def build(self):
        g = self.pkg
        config = g.ModelConfig.from_dict(json.loads(json.dumps(self.outer)))
        config.text_config = g.TextConfig.from_dict(self.text)
        config.vision_config = g.VisionConfig.from_dict(self.vision)
        config.audio_config = None
        return g.Model(config)

    def tie(self, params):
        pass

    def processor_files(self):
        return {
            "processor_config.json": {
                "processor_class": "Gemma4Processor",
                "image_processor": {
                    "image_processor_type": "Gemma4ImageProcessor", "patch_size": self.vision["patch_size"],
                    "pooling_kernel_size": 3, "max_soft_tokens": G4_MAX_SOFT_TOKENS, "do_resize": True,
                    "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": False,
                    "image_mean": [0.0] * 3, "image_std": [1.0] * 3, "resample": 3, "do_convert_rgb": True,
                },
                "image_seq_length": G4_MAX_SOFT_TOKENS,
            },
        }

    def extra_special(self):
        return {"boi_token": "<|image>", "eoi_token": "<image|>", "image_token": "<|image|>",
                "boa_token": "<|audio>", "eoa_token": "<audio|>", "audio_token": "<|audio|>",
                "video_token": "<|video|>"}

    def load_processor(self, path):
        from mlx_vlm.models.gemma4.processing_gemma4 import Gemma4Processor
        return Gemma4Processor.from_pretrained(str(path))

    def expand(self, tokenizer, prompt_text, images, proc_out):
        ids = tokenizer.encode(prompt_text, add_special_tokens=False)
        counts = list(proc_out["_num_soft_tokens"]) if images else []
        it = iter(counts)
        out = []
        for t in ids:
            if t == self.ids["image"]:
                out += [self.ids["boi"]] + [self.ids["image"]] * next(it) + [self.ids["eoi"]]
            else:
                out.append(t)
        return None, out, counts

    def set_hf_tower(self, model, hf):
        pass

    def features(self, model, pixel_values):
        return model.embed_vision(model.vision_tower(pixel_values))

    def _types(self, expanded):
        return mx.array([[1 if t == self.ids["image"] else 0 for t in expanded]])

    def mlx_vlm_tokens(self, model, expanded, proc_out, n_images):
        pv = proc_out["pixel_values"] if n_images else None
        steps = generate_step(mx.array([expanded]), model, pv, None, max_tokens=N_NEW,
                              sampler=lambda x: mx.argmax(x, axis=-1), mm_token_type_ids=self._types(expanded))
        return tokens_and_gap(steps)

    def hf_tokens(self, model, expanded, proc_out, n_images):
        ids = mx.array([expanded])
        pv = proc_out["pixel_values"] if n_images else None
        emb = model.get_input_embeddings(input_ids=ids, pixel_values=pv)
        full, sliding = hf_masks(expanded, self.ids["image"], self.text["sliding_window"], overlay_full=False)
        lm = model.language_model
        cache = lm.make_cache()

        def prefill_masks(h, c, mm_token_type_ids=None):
            # PATCH (Gemma 4, transformers' prefill masks): see the module docstring.
            assert h.shape[1] == len(expanded) and all(x.offset == 0 for x in c if x is not None)
            return [full if l.layer_type == "full_attention" else sliding for l in lm.model.layers]

        lm.model._make_masks = prefill_masks
        try:
            logits = lm(None, inputs_embeds=emb.inputs_embeds, per_layer_inputs=emb.per_layer_inputs,
                        cache=cache, mm_token_type_ids=self._types(expanded)).logits
        finally:
            del lm.model._make_masks
        return greedy_decode(model, logits, cache)


def gap(logits):
    """How far the greedy pick leads the runner-up (logits of one step)."""
    top = np.sort(np.array(logits.reshape(-1), dtype=np.float64))[-2:]
    return float(top[1] - top[0])


def tokens_and_gap(steps):
    """generate_step's tokens, and the smallest lead of a pick over the runner-up (log-probs)."""
    out, gaps = [], []
    for t, logprobs in steps:
        out.append(int(t))
        gaps.append(gap(logprobs))
    return out, min(gaps)


def greedy_decode(model, logits, cache):
    """The decode steps after a prefill: one token at a time, mlx-vlm's own masks (causal).
    Returns the tokens and the smallest lead of a pick over the runner-up."""
    out, gaps = [], []
    for _ in range(N_NEW):
        last = logits[:, -1, :]
        y = mx.argmax(last, axis=-1)
        out.append(int(y.item()))
        gaps.append(gap(last))
        if len(out) == N_NEW:
            break
        logits = model.language_model(y[None], cache=cache).logits
    return out, min(gaps)


def calibrate_clips(model, pixel_values):
    """Gemma 4's clipped linears: bounds at each linear's own 3rd and 97th percentiles of its input
    and output on one image (so they clip a few percent of the values, finite and different)."""
    from mlx_vlm.models.gemma4.vision import ClippableLinear
    seen = {}
    original = ClippableLinear.__call__

    def record(self, x):
        y = self.linear(x)
        seen[id(self)] = (np.array(x), np.array(y))
        return y

    ClippableLinear.__call__ = record
    try:
        mx.eval(model.vision_tower(pixel_values))
    finally:
        ClippableLinear.__call__ = original
    bounds = {}
    for name, m in model.vision_tower.named_modules():
        if isinstance(m, ClippableLinear):
            x, y = seen[id(m)]
            prefix = f"vision_tower.{name}"
            bounds[f"{prefix}.input_min"] = float(np.percentile(x, 3))
            bounds[f"{prefix}.input_max"] = float(np.percentile(x, 97))
            bounds[f"{prefix}.output_min"] = float(np.percentile(y, 3))
            bounds[f"{prefix}.output_max"] = float(np.percentile(y, 97))
    return {k: mx.array(round(v, 4), dtype=mx.float32) for k, v in bounds.items()}


def clip_fraction(model, pixel_values):
    """The share of the clipped linears' inputs and outputs their bounds change, on one image."""
    from mlx_vlm.models.gemma4.vision import ClippableLinear
    counts = [0, 0]
    original = ClippableLinear.__call__

    def count(self, x):
        xc = mx.clip(x, self.input_min, self.input_max)
        y = self.linear(xc)
        yc = mx.clip(y, self.output_min, self.output_max)
        counts[0] += int(mx.sum(xc != x).item()) + int(mx.sum(yc != y).item())
        counts[1] += x.size + y.size
        return yc

    ClippableLinear.__call__ = count
    try:
        mx.eval(model.vision_tower(pixel_values))
    finally:
        ClippableLinear.__call__ = original
    return counts[0] / counts[1]


def main():
    family = sys.argv[1] if len(sys.argv) > 1 else "gemma3"
    fam = {"gemma3": Gemma3, "gemma4": Gemma4}[family]()
    out = ROOT / f"tests/data/vision/tiny_{family}"
    out.mkdir(parents=True, exist_ok=True)
    mx.random.seed(SEEDS[family])

    model = fam.build()
    params = {k: random_like(family, k, v) for k, v in tree_flatten(model.parameters())}
    fam.tie(params)
    model.load_weights(list(params.items()))
    model.eval()

    # Files first: the processor is loaded from them (which checks them).
    write = lambda name, value: (out / name).write_text(json.dumps(value, indent=1) + "\n")
    write("config.json", fam.outer)
    for name, value in fam.processor_files().items():
        write(name, value)
    write("tokenizer.json", tokenizer_json(fam.special))
    write("tokenizer_config.json", {
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": None, "add_bos_token": False,
        "extra_special_tokens": fam.extra_special(), "chat_template": fam.template,
        "tokenizer_class": "PreTrainedTokenizerFast",
    })
    write("generation_config.json", {"bos_token_id": fam.ids["bos"], "eos_token_id": fam.outer["eos_token_id"],
                                     "pad_token_id": 0})
    processor = fam.load_processor(out)
    tokenizer = processor.tokenizer

    if family == "gemma4":
        # Finite clip bounds, from the tower's own activations on one image.
        data, _ = processor.image_processor([rgb("small.png")])
        clips = calibrate_clips(model, mx.array(data["pixel_values"]))
        params.update(clips)
        model.load_weights(list(clips.items()), strict=False)
    mx.save_safetensors(str(out / "model.safetensors"), params, metadata={"format": "mlx"})

    # The saved folder loads in mlx-vlm as it is, to the same parameters.
    from mlx_vlm.utils import load_model
    loaded = dict(tree_flatten(load_model(out).parameters()))
    assert loaded.keys() == params.keys(), set(loaded) ^ set(params)
    assert all(mx.array_equal(loaded[k], params[k]).item() for k in params)

    cases = []
    for name, turns in specs():
        messages = openai_messages(turns)
        images = [p for _, parts in turns for p in parts if p.endswith(IMAGE_FILES)]
        prompt_text = tokenizer.apply_chat_template(template_messages(messages), tokenize=False,
                                                    add_generation_prompt=True)
        prompt_ids = tokenizer.encode(prompt_text, add_special_tokens=False)
        proc_out = {}
        if images:
            proc = processor(text=prompt_text, images=[rgb(i) for i in images])
            proc_out = dict(proc)
            if family == "gemma4":
                _, proc_out["_num_soft_tokens"] = processor.image_processor([rgb(i) for i in images])
        expanded_text, expanded, counts = fam.expand(tokenizer, prompt_text, images, proc_out)
        if images:
            # mlx-vlm's own processor expands to the same ids.
            assert np.array(proc_out["input_ids"]).reshape(-1).tolist() == expanded, name
        else:
            assert expanded == prompt_ids
        fam.set_hf_tower(model, hf=False)
        mlx_vlm, mlx_vlm_gap = fam.mlx_vlm_tokens(model, expanded, proc_out, len(images))
        fam.set_hf_tower(model, hf=True)
        hf, hf_gap = fam.hf_tokens(model, expanded, proc_out, len(images))
        case = {"name": name, "images": images, "messages": messages, "prompt_text": prompt_text,
                "prompt_ids": prompt_ids}
        if family == "gemma3":
            case["expanded_text"] = expanded_text
        case.update({"expanded_ids": expanded, "tokens_per_image": counts, "output_ids": hf,
                     "output_ids_mlx_vlm": mlx_vlm,
                     # The smallest lead of a greedy pick over the runner-up, in logits: how much
                     # numerical slack a token-for-token comparison has.
                     "min_top2_gap": hf_gap, "min_top2_gap_mlx_vlm": mlx_vlm_gap})
        cases.append(case)
        print(f"{name}: {len(expanded)} tokens, {counts}, gaps {hf_gap:.4f} {mlx_vlm_gap:.4f}, hf {hf}, mlx-vlm {mlx_vlm}"
              f"{'' if hf == mlx_vlm else '  (differ)'}")

    # The towers alone: the features that reach the language model, per image.
    fam.set_hf_tower(model, hf=True)
    tower = {}
    for image in ["small.png", "banner.gif"]:
        if family == "gemma3":
            pv = processor.image_processor([rgb(image)], return_tensors="np")["pixel_values"]
        else:
            pv = processor.image_processor([rgb(image)])[0]["pixel_values"]
        feats = fam.features(model, mx.array(pv))
        tower[image] = {"pixel_values_shape": list(np.array(pv).shape), **stats(feats[0])}
    if family == "gemma4":
        data, _ = processor.image_processor([rgb("small.png")])
        tower["clip_fraction_small_png"] = clip_fraction(model, mx.array(data["pixel_values"]))

    image_cases = [c for c in cases if c["images"]]
    differ = [c["name"] for c in image_cases if c["output_ids"] != c["output_ids_mlx_vlm"]]
    text_only = [c for c in cases if not c["images"]][0]
    assert text_only["output_ids"] == text_only["output_ids_mlx_vlm"], "text only must agree"
    assert differ, "the tiny model does not tell the two semantics apart"
    print("differ:", differ)
    # No end of sequence among the 12 (a test that stops there still sees them all), and no image,
    # audio or video id: transformers' Gemma 4 embeds those as the pad token in every forward (its
    # `llm_input_ids`), mlx-vlm as themselves in the decode steps, which this script does not patch.
    avoid = set(fam.outer["eos_token_id"]) | {fam.ids[k] for k in ("image", "audio", "video") if k in fam.ids}
    bad = [c["name"] for c in cases if avoid & set(c["output_ids"] + c["output_ids_mlx_vlm"])]
    assert not bad, f"an end or media id among the tokens: {bad}"

    (ROOT / f"tests/data/reference/vision_{family}_generate.json").write_text(json.dumps({
        "description": (
            f"Greedy tokens of tests/data/vision/tiny_{family} (mlx-vlm's {family} Model, random weights, float32, "
            "CPU). output_ids: transformers' semantics, had by patching mlx-vlm (see the script's docstring): "
            + ("same-image blocks bidirectional in the prefill on full and sliding layers (sliding: AND the "
               "window after), SigLIP post_layernorm eps 1e-6; "
               if family == "gemma3" else
               "same-image blocks bidirectional in the prefill on sliding layers only (AND the window after), "
               "full layers causal; ")
            + "the prefill one forward of the whole expanded prompt from an empty cache, then one token per step. "
            "output_ids_mlx_vlm: mlx-vlm 0.7.6's generate_step unpatched. prompt_text is the chat template "
            "rendered with add_generation_prompt (messages' image_url parts as {\"type\": \"image\"}); "
            "prompt_ids its tokens (one placeholder per image); "
            + ("expanded_text the processor's replacement of each <start_of_image> by \\n\\n<start_of_image>, "
               f"{G3_MM_TOKENS} x <image_soft_token>, <end_of_image>\\n\\n, and expanded_ids its tokens. "
               if family == "gemma3" else
               "expanded_ids: each <|image|> replaced by <|image>, <|image|> x tokens_per_image, <image|>. ")
            + "tower: per image alone, the features that reach the language model ("
            + ("multi_modal_projector output" if family == "gemma3" else "embed_vision output")
            + "), float64 of float32; row_sums of the first 8 rows."),
        "regenerate": f".cache/venv/bin/python scripts/reference/vision_gemma_generate.py {family}",
        "tool_versions": {p: version(p) for p in ["mlx", "mlx-vlm", "transformers", "Pillow", "numpy"]},
        "special_token_ids": fam.ids,
        "pad_token_id": 0,
        "eos_token_ids": fam.outer["eos_token_id"],
        "cases_that_differ": differ,
        "cases": cases,
        "tower": tower,
    }, indent=None) + "\n")


if __name__ == "__main__":
    main()
