"""Reference M-RoPE positions (issue 36): mlx-vlm 0.7.6's Qwen3-VL `get_rope_index` (the 3D
time/row/column positions of a prompt with images, and the delta later tokens' positions take)
on a few token sequences with images of several grids. Writes tests/data/reference/vision_mrope.json.

Regenerate (from the repository root):

    .cache/venv/bin/python scripts/reference/vision_mrope.py
"""

import json
import pathlib
from types import SimpleNamespace

import mlx.core as mx

from mlx_vlm.models.qwen3_vl.language import LanguageModel

ROOT = pathlib.Path(__file__).resolve().parents[2]
IMAGE, START, END, VIDEO = 151655, 151652, 151653, 151656
MERGE = 2


def image(grid):
    t, h, w = grid
    return [START] + [IMAGE] * (t * (h // MERGE) * (w // MERGE)) + [END]


def main():
    fake = SimpleNamespace(config=SimpleNamespace(
        vision_config=SimpleNamespace(spatial_merge_size=MERGE),
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START))
    cases = []
    sequences = [
        ("one image", [10, 11, 12] + image([1, 4, 6]) + [13, 14], [[1, 4, 6]]),
        ("image first", image([1, 8, 4]) + [20, 21, 22, 23], [[1, 8, 4]]),
        ("two images, text between", [5] + image([1, 2, 2]) + [6, 7] + image([1, 6, 10]) + [8, 9, 10], [[1, 2, 2], [1, 6, 10]]),
        ("image last", [1, 2, 3, 4, 5] + image([1, 12, 4]), [[1, 12, 4]]),
    ]
    for name, tokens, grids in sequences:
        positions, deltas = LanguageModel.get_rope_index(fake, mx.array([tokens]), mx.array(grids))
        cases.append({"name": name, "tokens": tokens, "grids": grids,
                      "positions": mx.array(positions)[:, 0, :].tolist(), "delta": int(mx.array(deltas).reshape(-1)[0].item())})
    out = {"image_token": IMAGE, "merge": MERGE, "cases": cases}
    (ROOT / "tests/data/reference/vision_mrope.json").write_text(json.dumps(out) + "\n")
    print(len(cases), "cases", [c["delta"] for c in cases])


if __name__ == "__main__":
    main()
