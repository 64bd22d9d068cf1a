"""Images (issue 36): time to first token for a screenshot (tests/data/vision/screenshot.png, 1280 x 800)
on a small random Qwen3-VL-shaped model (a 4-block tower at Qwen3-VL's patch size and processor
settings: 4,000 patches, 1,000 image tokens; a 4-layer language model), FastMLX's server against
mlx-vlm 0.7.6's own generate on the same weights, one after the other.

    --case make DIR       writes the model (mlx-vlm's classes, random weights) to DIR
    --case fastmlx URL    the first turn (cold) and the next turn (the answer and a new question
                          after it: the image comes from the prefix cache) through /v1/chat/completions
    --case mlx-vlm DIR    the same two prompts through mlx-vlm's generate_step (no prefix cache: each
                          turn encodes the image and prefills the whole prompt)

Run by scripts/bench_vision.sh.
"""

import argparse
import base64
import importlib.util
import json
import pathlib
import time
import urllib.request

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "tests/data/vision/screenshot.png"
spec = importlib.util.spec_from_file_location("tiny", ROOT / "scripts/reference/vision_qwen3_vl_generate.py")
tiny = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tiny)

TEXT = {**tiny.TEXT, "num_hidden_layers": 4, "hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8,
        "num_key_value_heads": 4, "head_dim": 64, "max_position_embeddings": 32768,
        "rope_scaling": {"rope_type": "default", "mrope_section": [12, 10, 10], "mrope_interleaved": True}}
VISION = {**tiny.VISION, "depth": 4, "hidden_size": 256, "intermediate_size": 512, "out_hidden_size": 512,
          "num_heads": 4, "patch_size": 16, "num_position_embeddings": 2304, "deepstack_visual_indexes": [1, 2]}
PREPROCESSOR = {**tiny.PREPROCESSOR, "patch_size": 16, "size": {"shortest_edge": 65536, "longest_edge": 16777216}}
QUESTION = "What is on this screen?"
N_NEW = 8


def make(out: pathlib.Path):
    from mlx_vlm.models.qwen3_vl.config import ModelConfig, TextConfig, VisionConfig
    from mlx_vlm.models.qwen3_vl.qwen3_vl import Model

    outer = {**tiny.outer_config("qwen3_vl"), "text_config": TEXT, "vision_config": VISION}
    config = ModelConfig.from_dict(json.loads(json.dumps(outer)))
    config.text_config = TextConfig(**json.loads(json.dumps(TEXT)))
    config.vision_config = VisionConfig(**VISION)
    mx.random.seed(36)
    model = Model(config)
    params = {k: tiny.random_like(k, v) for k, v in tree_flatten(model.parameters())}
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), params, metadata={"format": "mlx"})
    write = lambda name, value: (out / name).write_text(json.dumps(value, indent=1) + "\n")
    write("config.json", outer)
    write("preprocessor_config.json", PREPROCESSOR)
    write("tokenizer.json", tiny.tokenizer_json())
    write("tokenizer_config.json", {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                    "chat_template": tiny.TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast"})
    write("generation_config.json", {"eos_token_id": [tiny.IM_END, tiny.EOT]})
    print(f"model written to {out}")


def stream_chat(url, messages):
    """Seconds to the first streamed token, the answer's text, the prompt and cached token counts."""
    model = json.loads(urllib.request.urlopen(url + "/v1/models").read())["data"][0]["id"]
    body = {"model": model, "messages": messages, "max_tokens": N_NEW, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    first, text, usage = None, "", {}
    with urllib.request.urlopen(req) as resp:
        for line in resp:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                if choice["delta"].get("content") and first is None:
                    first = time.perf_counter() - start
                text += choice["delta"].get("content") or ""
    return first, text, usage


def fastmlx(url):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(SCREENSHOT.read_bytes()).decode()}}
    turn1 = [{"role": "user", "content": [image, {"type": "text", "text": QUESTION}]}]
    ttft1, answer, usage1 = stream_chat(url, turn1)
    turn2 = turn1 + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And the title bar?"}]
    ttft2, _, usage2 = stream_chat(url, turn2)
    cached = (usage2.get("prompt_tokens_details") or {}).get("cached_tokens")
    print(f"FastMLX   first turn: TTFT {ttft1 * 1e3:7.0f} ms ({usage1.get('prompt_tokens')} prompt tokens)")
    print(f"FastMLX   next turn:  TTFT {ttft2 * 1e3:7.0f} ms ({usage2.get('prompt_tokens')} prompt tokens, {cached} from the prefix cache)")


def mlx_vlm(model_dir: pathlib.Path):
    from PIL import Image

    from mlx_vlm.generate.ar import generate_step
    from mlx_vlm.models.qwen3_vl.config import ModelConfig, TextConfig, VisionConfig
    from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import Qwen3VLImageProcessor, _to_numpy_image
    from mlx_vlm.models.qwen3_vl.qwen3_vl import Model

    outer = json.loads((model_dir / "config.json").read_text())
    config = ModelConfig.from_dict(json.loads(json.dumps(outer)))
    config.text_config = TextConfig(**outer["text_config"])
    config.vision_config = VisionConfig(**outer["vision_config"])
    model = Model(config)
    model.load_weights(str(model_dir / "model.safetensors"))
    mx.eval(model.parameters())
    proc = Qwen3VLImageProcessor(patch_size=16, temporal_patch_size=2, merge_size=2, min_pixels=65536,
                                 max_pixels=16777216, image_mean=[0.5] * 3, image_std=[0.5] * 3)

    def ttft(ids_before, ids_after):
        start = time.perf_counter()
        values, grid = proc._process_one(_to_numpy_image(Image.open(SCREENSHOT)))
        tokens = grid[0] * grid[1] * grid[2] // 4
        ids = ids_before + [tiny.IMAGE_PAD] * tokens + ids_after
        steps = generate_step(mx.array([ids]), model, mx.array(values), None, max_tokens=N_NEW,
                              sampler=lambda x: mx.argmax(x, axis=-1), image_grid_thw=mx.array([list(grid)]))
        first, _ = next(steps)
        elapsed = time.perf_counter() - start
        out = [int(first)] + [int(t) for t, _ in steps]
        return elapsed, out, len(ids)

    text = tiny.text
    before = [tiny.IM_START] + text("user\n") + [tiny.VISION_START]
    after1 = [tiny.VISION_END] + text(QUESTION) + [tiny.IM_END] + text("\n") + [tiny.IM_START] + text("assistant\n")
    t1, answer, n1 = ttft(before, after1)
    after2 = after1 + answer + [tiny.IM_END] + text("\n") + [tiny.IM_START] + text("user\nAnd the title bar?") + [
        tiny.IM_END] + text("\n") + [tiny.IM_START] + text("assistant\n")
    t2, _, n2 = ttft(before, after2)
    print(f"mlx-vlm   first turn: TTFT {t1 * 1e3:7.0f} ms ({n1} prompt tokens)")
    print(f"mlx-vlm   next turn:  TTFT {t2 * 1e3:7.0f} ms ({n2} prompt tokens, no prefix cache)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True, choices=["make", "fastmlx", "mlx-vlm"])
    ap.add_argument("target")
    a = ap.parse_args()
    {"make": lambda: make(pathlib.Path(a.target)), "fastmlx": lambda: fastmlx(a.target),
     "mlx-vlm": lambda: mlx_vlm(pathlib.Path(a.target))}[a.case]()


if __name__ == "__main__":
    main()
