"""Reference drafts of a Qwen3.5 multi-token-prediction (MTP) head on FastMLX's tiny models.

mlx-lm 0.32.2 drops the `mtp.*` tensors; mlx-vlm 0.7.6 (the newest on mlx 0.32.2) runs them
as a drafter (`mlx_vlm.speculative.drafters.qwen3_5_mtp`), and is the reference here. FastMLX
writes each model (`fastmlx make-test-model --mtp`); mlx-lm's loader and classes run the
target over the prompt, giving the hidden states after its final norm and its greedy next
token; mlx-vlm's drafter takes the prompt shifted by one (and that token) beside those hidden
states, then drafts greedily. The Rust test `tests/mtp.rs` must reproduce the drafts.
Regenerate (from the repository root, after `cargo build`; mlx-vlm without its dependencies,
which this path does not import, and Pillow, which its package imports):

    .cache/venv/bin/pip install --no-deps mlx-vlm==0.7.6 Pillow
    .cache/venv/bin/python scripts/reference/mtp_drafts.py

Writes tests/data/reference/mtp_drafts.json.
"""

import json
import subprocess
import tempfile
from importlib.metadata import version
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import load_model
from mlx_vlm.speculative.drafters.qwen3_5_mtp.config import Qwen3_5MTPConfig
from mlx_vlm.speculative.drafters.qwen3_5_mtp.qwen3_5_mtp import Qwen3_5MTPDraftModel

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests/data/reference/mtp_drafts.json"
BINARY = ROOT / "target/debug/fastmlx"
SEED = 7
PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 32, 84, 104, 105, 115, 32, 105, 115]
# The drafter's block: its seed token (from the prompt's last position) and two more forwards.
BLOCK = 4
MODELS = [("qwen3_5", []), ("qwen3_5_moe", ["--moe"])]


def drafts(folder: Path) -> dict:
    model, config = load_model(folder)
    text = model.language_model
    ids = mx.array([PROMPT])
    cache = text.make_cache()
    hidden = text.model(ids, cache=cache)
    bonus = mx.argmax(text.lm_head(hidden[:, -1, :]), axis=-1)

    text_config = dict(config["text_config"])
    if config["model_type"].endswith("_moe"):
        # mlx-vlm picks the layer with experts by the text model's type, which published configs
        # name so (FastMLX's tiny ones leave it as the dense one's; mlx-lm reads the outer type).
        text_config["model_type"] = "qwen3_5_moe_text"
    mtp_config = Qwen3_5MTPConfig.from_dict({"text_config": text_config})
    drafter = Qwen3_5MTPDraftModel(mtp_config)
    # The tensors as FastMLX writes them: MLX's layout (norms as they are used), so only the
    # prefix goes (mlx-vlm's own sanitize would add 1 to the norms, as for Hugging Face's).
    weights = mx.load(str(folder / "model.safetensors"))
    drafter.load_weights([(k[len("mtp.") :], v) for k, v in weights.items() if k.startswith("mtp.")])
    drafter.reset(model)
    drafter.prefill_from_target_hidden(ids, hidden, bonus, sampler=None, greedy=True)
    block = drafter.draft_block(bonus, hidden[:, -1:, :], None, BLOCK, sampler=None, greedy=True)
    return {"next_token": bonus.item(), "drafts": block[0].tolist()}


def main() -> None:
    cases = []
    for name, flags in MODELS:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / name
            subprocess.run(
                [str(BINARY), "make-test-model", "--arch", "qwen3_5", "--seed", str(SEED), "--mtp", str(folder), *flags],
                check=True,
            )
            cases.append({"name": name, "flags": flags, **drafts(folder)})
            print(name, cases[-1]["next_token"], cases[-1]["drafts"])
    OUT.write_text(
        json.dumps(
            {
                "mlx": version("mlx"),
                "mlx_lm": version("mlx-lm"),
                "mlx_vlm": version("mlx-vlm"),
                "seed": SEED,
                "prompt_ids": PROMPT,
                "block": BLOCK,
                "cases": cases,
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
