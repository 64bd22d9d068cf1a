"""Reference pixel values for the Gemma 3 and Gemma 4 image preprocessing, with the real checkpoints'
settings, on every image in tests/data/vision/ (written by vision_preprocess.py).

- Gemma 3: transformers 5.24's `Gemma3ImageProcessorPil`, the class mlx-vlm 0.7.6's
  `Gemma3Processor` loads (`use_fast=False`), with google/gemma-3-*-it's preprocessor_config.json:
  a Pillow BILINEAR resize of the uint8 RGB image to 896 x 896 (squashed, the aspect ratio not
  kept), then `x * (1/255)` in float64 rounded to float32, then `(x - 0.5) / 0.5` in float32.
- Gemma 4: mlx-vlm 0.7.6's own `Gemma4ImageProcessor` (patch 16, pooling 3) at max_soft_tokens
  280 (the checkpoints' default), 70 and 1120: a Pillow BICUBIC resize of the uint8 image to the
  largest multiples of 48 within the patch budget, aspect ratio kept, then
  `float32(x) * float32(1/255)` (no normalisation: the model computes 2x - 1 itself).

The image goes in as mlx-vlm's pipeline hands it over: `convert("RGB")`, an alpha channel dropped
(small.png has one). Per image and setting: the resized size and the SHA-256 of the resized uint8
RGB (row-major H x W x 3), computed with the processor's own resize and checked against Pillow's;
the pixel values' shape, SHA-256 of their float32 little-endian bytes in the order the processor
returns them (N x C x H x W, channels first, for both), sum and first values; Gemma 4's tokens per
image. Also the values transformers would give where they differ:
- Gemma 4: `pixels_sha256_transformers`, transformers' `Gemma4ImageProcessorPil` rescale
  (float64 then float32, i.e. the correctly rounded x/255), which differs from mlx-vlm's float32
  product in the last bit for 126 of the 256 byte values; checked against that processor's own
  patches (it returns patches [N, max_patches, 768] in (row, col, channel) order, padded).
- small.png with its alpha: `gemma3_transformers_rgba`: transformers' processor given the RGBA
  image with do_convert_rgb on composites it onto white (the checkpoints' config says
  `do_convert_rgb: null`, with which transformers refuses a 4-channel image).

Regenerate (from the repository root):

    .cache/venv/bin/python scripts/reference/vision_gemma_preprocess.py
"""

import base64
import hashlib
import json
import pathlib
from importlib.metadata import version

import numpy as np
from PIL import Image

from mlx_vlm.models.gemma4.processing_gemma4 import Gemma4ImageProcessor
from transformers.image_utils import ChannelDimension
from transformers.image_processing_utils import SizeDict
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

ROOT = pathlib.Path(__file__).resolve().parents[2]
IMAGES = ROOT / "tests/data/vision"
NAMES = ["small.png", "tall.png", "screenshot.png", "banner.gif", "wide.jpg", "photo.jpg"]

# google/gemma-3-4b-it's preprocessor_config.json (the values that matter).
GEMMA3 = {"size": {"height": 896, "width": 896}, "resample": 2, "do_resize": True, "do_rescale": True,
          "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
          "do_convert_rgb": None, "do_pan_and_scan": None}
# google/gemma-4-*'s processor_config.json "image_processor", at three soft-token budgets.
GEMMA4 = {"patch_size": 16, "pooling_kernel_size": 3, "rescale_factor": 1 / 255, "do_normalize": False,
          "image_mean": [0.0] * 3, "image_std": [1.0] * 3, "resample": 3}
GEMMA4_BUDGETS = [280, 70, 1120]


def sha(b):
    return hashlib.sha256(b).hexdigest()


def rgb_image(name):
    img = Image.open(IMAGES / name)
    return img.convert("RGB") if img.mode != "RGB" else img


def pixel_fields(pixels):
    p = np.ascontiguousarray(pixels, dtype=np.float32)
    return {"shape": list(p.shape), "layout": "NCHW", "pixels_sha256": sha(p.astype("<f4").tobytes()),
            "sum": float(p.astype(np.float64).sum()), "first": [float(v) for v in p.reshape(-1)[:8]]}


def gemma3_case(name, img, config="gemma3"):
    proc = Gemma3ImageProcessorPil(**GEMMA3) if config == "gemma3" else \
        Gemma3ImageProcessorPil(**{**GEMMA3, "do_convert_rgb": True})
    pixels = proc([img], return_tensors="np")["pixel_values"]
    if config == "gemma3":
        decoded = np.array(img)
    else:  # what its convert_to_rgb made of the RGBA image
        decoded = np.moveaxis(proc.process_image(img, do_convert_rgb=True), 0, -1)
    chw = np.moveaxis(decoded, -1, 0)
    # The processor's own resize (Pillow on the uint8 image, via to_pil_image: not a float array).
    resized = np.moveaxis(proc.resize(chw, SizeDict(height=896, width=896), resample=2), 0, -1)
    assert resized.dtype == np.uint8
    pillow = np.array(Image.fromarray(decoded).resize((896, 896), resample=Image.BILINEAR))
    assert np.array_equal(resized, pillow)
    # The arithmetic as described: float64 product rounded to float32, then float32 normalise.
    x = (np.moveaxis(resized, -1, 0).astype(np.float64) * (1 / 255)).astype(np.float32)
    assert np.array_equal(pixels[0], (x - np.float32(0.5)) / np.float32(0.5))
    return {"image": name, "config": config, "decoded_sha256": sha(np.ascontiguousarray(decoded).tobytes()),
            "resized": [896, 896], "resized_sha256": sha(np.ascontiguousarray(resized).tobytes()),
            **pixel_fields(pixels)}


def gemma4_case(name, img, budget):
    proc = Gemma4ImageProcessor(**GEMMA4, max_soft_tokens=budget)
    data, tokens = proc([img])
    pixels = data["pixel_values"]
    assert isinstance(pixels, np.ndarray) and pixels.ndim == 4
    decoded = np.array(img)
    resized = proc.aspect_ratio_preserving_resize(decoded, 16, budget * 9, 3, ChannelDimension.LAST)
    assert resized.dtype == np.uint8
    h, w = resized.shape[:2]
    if (h, w) != decoded.shape[:2]:
        pillow = np.array(Image.fromarray(decoded).resize((w, h), resample=Image.BICUBIC))
        assert np.array_equal(resized, pillow)
    x = np.moveaxis(resized, -1, 0)[None]
    assert np.array_equal(pixels, x.astype(np.float32) * np.float32(1 / 255))
    # transformers' rescale of the same bytes, checked against its processor's patches.
    hf = (x.astype(np.float64) * (1 / 255)).astype(np.float32)
    hf_proc = Gemma4ImageProcessorPil(**GEMMA4, max_soft_tokens=budget)
    hf_out = hf_proc([img], return_tensors="np")
    n = (h // 16) * (w // 16)
    patches = hf[0].reshape(3, h // 16, 16, w // 16, 16).transpose(1, 3, 2, 4, 0).reshape(n, -1)
    assert np.array_equal(hf_out["pixel_values"][0, :n], patches)
    assert list(hf_out["num_soft_tokens_per_image"]) == list(tokens)
    return {"image": name, "config": f"gemma4_{budget}", "max_soft_tokens": budget,
            "resized": [int(w), int(h)], "resized_sha256": sha(np.ascontiguousarray(resized).tobytes()),
            **pixel_fields(pixels), "tokens": int(tokens[0]),
            "pixels_sha256_transformers": sha(np.ascontiguousarray(hf).astype("<f4").tobytes()),
            "differs_from_transformers": bool(not np.array_equal(hf, pixels))}


def main():
    images, cases = {}, []
    for name in NAMES:
        img = rgb_image(name)
        rgb = np.array(img)
        images[name] = {
            "mode": Image.open(IMAGES / name).mode, "size": [img.width, img.height],
            "decoded_sha256": sha(np.ascontiguousarray(rgb).tobytes()),
            "decoded_sum": int(rgb.astype(np.int64).sum()),
            "decoded_crop": base64.b64encode(np.ascontiguousarray(rgb[:32, :32]).tobytes()).decode(),
        }
        cases.append(gemma3_case(name, img))
        if Image.open(IMAGES / name).mode == "RGBA":
            cases.append(gemma3_case(name, Image.open(IMAGES / name), config="gemma3_transformers_rgba"))
        for budget in GEMMA4_BUDGETS:
            cases.append(gemma4_case(name, img, budget))
    for c in cases:
        print(c["image"], c["config"], c["resized"], c["shape"], c.get("tokens", ""), c.get("differs_from_transformers", ""))
    (ROOT / "tests/data/reference/vision_gemma_preprocess.json").write_text(json.dumps({
        "description": (
            "Gemma 3 (transformers Gemma3ImageProcessorPil, as mlx-vlm loads it; 896x896 Pillow BILINEAR "
            "squash of the uint8 RGB, x*(1/255) in float64 -> float32, (x-0.5)/0.5 in float32) and Gemma 4 "
            "(mlx-vlm Gemma4ImageProcessor; patch 16, pooling 3, max_soft_tokens 280/70/1120; Pillow BICUBIC of "
            "the uint8 RGB to multiples of 48 within max_soft_tokens*9 patches, aspect kept; float32(x)*float32(1/255), "
            "no normalisation). Inputs: the image convert('RGB')-ed as mlx-vlm's pipeline does (alpha dropped). "
            "images: the RGB handed to the processors (decoded_crop: its first 32x32 pixels, base64 RGB bytes). "
            "resized [w, h], resized_sha256 of the resized uint8 RGB row-major HxWx3. pixels_sha256: float32 "
            "little-endian bytes in the processor's order, N x C x H x W (channels first), both families. "
            "Gemma 4: tokens = (h/16)(w/16)/9; pixels_sha256_transformers: transformers' Gemma4ImageProcessorPil "
            "rescale (float64 product rounded to float32) of the same resized bytes, in the same NCHW order "
            "(that processor itself returns [N, max_patches, 768] patches in (row, col, channel) order). "
            "gemma3_transformers_rgba: transformers' Gemma 3 processor with do_convert_rgb on, given small.png's "
            "RGBA, composites onto white (decoded_sha256: the composited RGB)."),
        "regenerate": ".cache/venv/bin/python scripts/reference/vision_gemma_preprocess.py",
        "tool_versions": {p: version(p) for p in ["mlx-vlm", "transformers", "Pillow", "numpy"]},
        "configs": {"gemma3": GEMMA3, "gemma4": {**GEMMA4, "max_soft_tokens": GEMMA4_BUDGETS}},
        "images": images,
        "cases": cases,
    }, indent=1) + "\n")
    print(f"{len(cases)} cases over {len(images)} images")


if __name__ == "__main__":
    main()
