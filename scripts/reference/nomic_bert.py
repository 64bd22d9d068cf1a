"""Reference vectors for the tiny NomicBERT embedder (issue 34): transformers' own `nomic_bert`
model (PyTorch), loaded from the layout the Hub ships (nomic's remote-code names: `Wqkv`, `fc11`,
`fc12`, `fc2`, `norm1`, `emb_ln`, which transformers' checkpoint conversion renames and splits),
then sentence-transformers' mean pooling and Normalize, written out. mlx-embeddings 0.1.0 has no
NomicBERT class, hence PyTorch here, in a venv of its own (not the tests' .cache/venv):

    python3 -m venv /tmp/ref-torch && /tmp/ref-torch/bin/pip install torch==2.9.1 transformers==5.24.0
    cargo build && /tmp/ref-torch/bin/python scripts/reference/nomic_bert.py

The rows are embeddings.py's tiny ones, from its output (token ids in one padded batch); the output,
tests/data/reference/nomic_bert.json, has the shape of embeddings.json's "tiny" list.
"""

import json
import subprocess
import tempfile
from importlib.metadata import version
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import NomicBertConfig, NomicBertModel

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests/data/reference/nomic_bert.json"
BINARY = ROOT / "target/debug/fastmlx"
SEED = 11
# The rows and instruction lengths of embeddings.py's tiny cases (the prompt is pooled here:
# include_prompt is true), read from its output so the two cannot drift apart.
_TINY = json.loads((ROOT / "tests/data/reference/embeddings.json").read_text())["tiny"][0]
TINY_ROWS, TINY_PROMPTS = _TINY["rows"], _TINY["prompt_lens"]
VARIANTS = ["nomic-bert-mean"]


def native_config(hub: dict) -> NomicBertConfig:
    """The Hub's remote-code config in transformers' own names."""
    assert hub["activation_function"] == "swiglu" and hub["rotary_emb_fraction"] == 1.0
    return NomicBertConfig(
        vocab_size=hub["vocab_size"],
        hidden_size=hub["n_embd"],
        num_hidden_layers=hub["n_layer"],
        num_attention_heads=hub["n_head"],
        intermediate_size=hub["n_inner"],
        max_position_embeddings=hub["n_positions"],
        type_vocab_size=hub["type_vocab_size"],
        layer_norm_eps=hub["layer_norm_epsilon"],
        hidden_act="silu",
        pad_token_id=hub.get("pad_token_id", 0),
        rope_parameters={"rope_type": "default", "rope_theta": float(hub["rotary_emb_base"])},
    )


def vectors(folder: Path, tmp: Path):
    converted = tmp / f"{folder.name}-transformers"
    converted.mkdir()
    config = native_config(json.loads((folder / "config.json").read_text()))
    config.save_pretrained(converted)
    # The checkpoint as the Hub names it: transformers' conversion mapping does the renaming.
    save_file(load_file(folder / "model.safetensors"), converted / "model.safetensors", metadata={"format": "pt"})
    model, info = NomicBertModel.from_pretrained(converted, attn_implementation="eager", output_loading_info=True)
    model.eval()
    # Every tensor of the Hub layout found its place, and every parameter came from the file.
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    width = max(len(r) for r in TINY_ROWS)
    ids = torch.tensor([r + [0] * (width - len(r)) for r in TINY_ROWS])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in TINY_ROWS])
    with torch.no_grad():
        tokens = model(input_ids=ids, attention_mask=mask).last_hidden_state
    # sentence-transformers' Pooling (mean_tokens, the prompt included) and Normalize.
    m = mask.unsqueeze(-1).float()
    pooled = (tokens * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=1).tolist()


def main():
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name in VARIANTS:
            folder = tmp / name
            subprocess.run([BINARY, "make-test-model", "--encoder", name, "--seed", str(SEED), folder], check=True)
            rows = [[float(f"{x:.7g}") for x in v] for v in vectors(folder, tmp)]
            cases.append({"variant": name, "seed": SEED, "rows": TINY_ROWS, "prompt_lens": TINY_PROMPTS,
                          "vectors": rows})
    out = {"generated_by": "scripts/reference/nomic_bert.py", "torch": version("torch"),
           "transformers": version("transformers"), "tiny": cases}
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
