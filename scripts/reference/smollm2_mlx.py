"""Reference greedy outputs of the exported 4-bit MLX SmolLM2, via plain mlx_lm.load.

Same prompts and format as smollm2_gguf.py, for comparing the Rust engine's MLX-directory
loader token-for-token. Regenerate with (from the repository root):

    .cache/venv/bin/python scripts/reference/export_mlx_model.py   # if the dir is missing
    .cache/venv/bin/python scripts/reference/smollm2_mlx.py [MODEL_DIR]

Writes tests/data/reference/smollm2_mlx_4bit.json. Tokenizer and chat template come from the
exported directory (tokenizer.json / tokenizer_config.json), as an mlx-lm user would get them.
"""

import hashlib
import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm import load

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_mlx_model import DEFAULT_OUT  # noqa: E402
from smollm2_gguf import ROOT, run_cases, write  # noqa: E402

OUT = ROOT / "tests/data/reference/smollm2_mlx_4bit.json"


def main():
    model_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    mx.set_default_device(mx.cpu)
    model, tokenizer = load(str(model_dir))
    # The export writes float32 norms/scales/biases, so mlx-lm computes in float32 throughout.
    dtypes = {str(v.dtype) for _, v in tree_flatten(model.parameters())}
    assert dtypes <= {"mlx.core.float32", "mlx.core.uint32"}, dtypes
    config = json.loads((model_dir / "config.json").read_text())
    header = {
        "description": "Greedy decoding with mlx_lm.load + generate_step on the MLX 4-bit "
        "(group 64, affine) export of the Q4_1 GGUF made by export_mlx_model.py; float32 "
        "non-quantized params, scales and biases; Hugging Face Q/K row order, non-traditional rope.",
        "regenerate": ".cache/venv/bin/python scripts/reference/export_mlx_model.py && "
        ".cache/venv/bin/python scripts/reference/smollm2_mlx.py",
        "model_dir": model_dir.name,
        "model_safetensors_sha256": hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest(),
        "quantization": config["quantization"],
        "compute_dtype": "float32",
        "sampling": "greedy (argmax); EOS does not stop generation",
        "eos_token_id": config["eos_token_id"],
    }
    write(OUT, header, run_cases(model, tokenizer, chat_template=None))


if __name__ == "__main__":
    main()
