"""Reference outputs of a tiny Qwen3-VL vision tower (issue 36), mlx-vlm 0.7.6's own
`qwen3_vl.vision.VisionModel` with random weights: two images in one batch (tests/data/vision's
small.png and banner.gif, preprocessed by mlx-vlm's Qwen3VLImageProcessor with Qwen3-VL's settings but 8-pixel patches,
which tests/vision.rs shows FastMLX's preprocessing equals to the byte), the merged features and
the deepstack features. Writes the weights in the mlx-community layout (`vision_tower.*`, the patch
embedding's kernel channels-last) to tests/data/vision/tiny_qwen3_vl_vision/ and the outputs to
tests/data/reference/vision_qwen3_vl.json.

Regenerate (from the repository root):

    .cache/venv/bin/python scripts/reference/vision_qwen3_vl.py
"""

import json
import pathlib

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from PIL import Image

from mlx_vlm.models.qwen3_vl.config import VisionConfig
from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import Qwen3VLImageProcessor, _to_numpy_image
from mlx_vlm.models.qwen3_vl.vision import VisionModel

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests/data/vision/tiny_qwen3_vl_vision"

CONFIG = {
    "model_type": "qwen3_vl", "depth": 3, "hidden_size": 16, "intermediate_size": 32, "out_hidden_size": 24,
    "num_heads": 2, "patch_size": 8, "temporal_patch_size": 2, "spatial_merge_size": 2, "in_channels": 3,
    "num_position_embeddings": 64, "deepstack_visual_indexes": [0, 1],
}


def main():
    mx.random.seed(361)
    model = VisionModel(VisionConfig(**CONFIG))
    # Random weights of a useful scale (the default init leaves LayerNorms at one and biases at zero).
    params = {k: mx.random.normal(v.shape) * (0.5 if v.ndim == 1 else 0.2) for k, v in tree_flatten(model.parameters())}
    model.load_weights(list(params.items()))
    model.eval()
    proc = Qwen3VLImageProcessor(patch_size=8, temporal_patch_size=2, merge_size=2, min_pixels=65536, max_pixels=16777216)
    pixels, grids = [], []
    for name in ["small.png", "banner.gif"]:
        image = _to_numpy_image(Image.open(ROOT / "tests/data/vision" / name))
        values, grid = proc._process_one(image)
        pixels.append(values)
        grids.append(grid)
    hidden, deepstack = model(mx.array(np.concatenate(pixels)), mx.array(grids))
    mx.eval(hidden, *deepstack)
    OUT.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(OUT / "model.safetensors"), {f"vision_tower.{k}": v for k, v in params.items()})
    (OUT / "config.json").write_text(json.dumps({"vision_config": CONFIG}, indent=1) + "\n")

    def summary(a):
        a = np.array(a, dtype=np.float64)
        return {"shape": list(a.shape), "row_sums": a.sum(axis=1).tolist(), "first": a.reshape(-1)[:32].tolist(),
                "sum": float(a.sum()), "abs_sum": float(np.abs(a).sum())}

    out = {"config": CONFIG, "images": ["small.png", "banner.gif"], "grids": grids,
           "merged": summary(hidden), "deepstack": [summary(d) for d in deepstack]}
    (ROOT / "tests/data/reference/vision_qwen3_vl.json").write_text(json.dumps(out) + "\n")
    print("merged", hidden.shape, "deepstack", [d.shape for d in deepstack], "grids", grids)


if __name__ == "__main__":
    main()
