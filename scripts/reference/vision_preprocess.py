"""Reference pixel values for the vision preprocessing tests (issue 36).

Makes a few test images (seeded, so the files are reproducible) in the formats a request carries
(PNG, JPEG, GIF) and the shapes that matter (a 1280 x 800 screenshot, a photo, tall and wide
ones, one smaller than the minimum), and runs mlx-vlm 0.7.6's own Qwen-VL image processor
(`Qwen3VLImageProcessor`: Pillow's bicubic resize, numpy normalisation) over them with the
settings of three checkpoints. Written out: the images (tests/data/vision/), and per image and
setting the decoded RGB's, the resized RGB's and the pixel values' SHA-256 (f32 little-endian),
the grid and a few values for a readable failure. The resize is Pillow 13's (it resizes down first
where the height shrinks by more than twice the width: earlier Pillows always went across first).

Regenerate (from the repository root):

    .cache/venv/bin/python scripts/reference/vision_preprocess.py
"""

import base64
import hashlib
import io
import json
import pathlib

import numpy as np
from PIL import Image, ImageDraw

from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import Qwen3VLImageProcessor, _to_numpy_image

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests/data/vision"

# The processor settings of three checkpoints' preprocessor_config.json.
CONFIGS = {
    # Qwen3-VL / Qwen3.5: 16-pixel patches, a budget of 256^2 to 4096^2 pixels.
    "qwen3_vl": {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
                 "size": {"shortest_edge": 65536, "longest_edge": 16777216},
                 "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
    # Qwen2.5-VL: 14-pixel patches, CLIP's normalisation.
    "qwen2_5_vl": {"patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
                   "min_pixels": 3136, "max_pixels": 12845056,
                   "image_mean": [0.48145466, 0.4578275, 0.40821073],
                   "image_std": [0.26862954, 0.26130258, 0.27577711]},
    # No sizes given: the processor's own defaults (about a megapixel at most).
    "defaults": {},
}


def screenshot(rng):
    """A 1280 x 800 window: flat panels, lines of 'text', a gradient header."""
    img = Image.new("RGB", (1280, 800), (246, 247, 249))
    d = ImageDraw.Draw(img)
    for x in range(1280):
        d.line([(x, 0), (x, 44)], fill=(30 + x // 20, 60, 120 + x // 12))
    d.rectangle([0, 45, 220, 800], fill=(232, 234, 238))
    for row in range(40):
        y = 70 + row * 18
        widths = rng.integers(4, 40, size=12)
        x = 240
        for w in widths:
            d.rectangle([x, y, x + int(w) * 4, y + 9], fill=tuple(int(v) for v in rng.integers(0, 90, 3)))
            x += int(w) * 4 + 8
            if x > 1240:
                break
    return img


def photo(rng, w, h, noise=12.0):
    """Smooth colour fields with noise: what a camera's JPEG looks like to a resize."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([128 + 100 * np.sin(xx / 37 + c) * np.cos(yy / 23 - c) for c in range(3)], axis=-1)
    noisy = base + rng.normal(0, noise, size=base.shape)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


def encode(img, fmt, **kw):
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def sha(b):
    return hashlib.sha256(b).hexdigest()


def main():
    rng = np.random.default_rng(36)
    OUT.mkdir(parents=True, exist_ok=True)
    images = {
        "screenshot.png": encode(screenshot(rng), "PNG", optimize=True),
        "photo.jpg": encode(photo(rng, 640, 480), "JPEG", quality=88),
        "tall.png": encode(photo(rng, 300, 1000, noise=0.0), "PNG", optimize=True),
        "wide.jpg": encode(photo(rng, 1500, 260), "JPEG", quality=75, subsampling=0),
        # With an alpha channel, which the processor drops (not composited).
        "small.png": encode(Image.fromarray(np.dstack([np.array(photo(rng, 33, 77)), rng.integers(0, 256, (77, 33), dtype=np.uint8)])), "PNG"),
        "banner.gif": encode(photo(rng, 500, 200).convert("P", palette=Image.ADAPTIVE, colors=64), "GIF"),
    }
    cases = []
    for name, data in images.items():
        (OUT / name).write_bytes(data)
        decoded = _to_numpy_image(Image.open(io.BytesIO(data)))  # (C, H, W) uint8, as the processor reads it
        rgb = np.ascontiguousarray(np.transpose(decoded, (1, 2, 0)))
        for cfg_name, cfg in CONFIGS.items():
            kwargs = {k: v for k, v in cfg.items() if k != "size"}
            if "size" in cfg:
                kwargs["min_pixels"] = cfg["size"]["shortest_edge"]
                kwargs["max_pixels"] = cfg["size"]["longest_edge"]
            proc = Qwen3VLImageProcessor(**kwargs)
            h, w = proc._resolved_size(rgb.shape[0], rgb.shape[1])
            resized = np.array(Image.fromarray(rgb).resize((w, h), resample=Image.BICUBIC)) if (h, w) != rgb.shape[:2] else rgb
            pixels, grid = proc._process_one(decoded)
            pixels = np.ascontiguousarray(pixels, dtype=np.float32)
            cases.append({
                "image": name,
                "config": cfg_name,
                "size": [int(rgb.shape[1]), int(rgb.shape[0])],
                "decoded_sha256": sha(rgb.tobytes()),
                # JPEG decoders differ in their last bits (libjpeg-turbo's here): a 32 x 32 crop of
                # Pillow's pixels, and their sum, for a test that bounds the difference.
                "decoded_crop": base64.b64encode(np.ascontiguousarray(rgb[:32, :32]).tobytes()).decode(),
                "decoded_sum": int(rgb.astype(np.int64).sum()),
                "resized": [int(w), int(h)],
                "resized_sha256": sha(np.ascontiguousarray(resized).tobytes()),
                "grid": [int(g) for g in grid],
                "shape": list(pixels.shape),
                "pixels_sha256": sha(pixels.astype("<f4").tobytes()),
                "first": [float(v) for v in pixels.reshape(-1)[:8]],
                "sum": float(pixels.astype(np.float64).sum()),
            })
    (OUT / "preprocessor_configs.json").write_text(json.dumps(CONFIGS, indent=1) + "\n")
    (ROOT / "tests/data/reference/vision_preprocess.json").write_text(json.dumps({"cases": cases}, indent=1) + "\n")
    print(f"{len(cases)} cases over {len(images)} images")


if __name__ == "__main__":
    main()
