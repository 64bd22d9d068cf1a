"""Tiny GGUF models with K-quant (and legacy block) tensors, and their dequantized reference,
for tests/gguf_kquants.rs. A Llama of hidden size 256 (K-quant blocks hold 256 values), two
layers, SmolLM2's tokenizer (copied from its GGUF's metadata); tensors as llama.cpp's mixes
have them: Q4_K_M (Q4_K, with Q6_K for attn_v, ffn_down and the output head), Q5_K_M (Q5_K
with Q6_K), Q3_K_M (Q3_K with Q4_K), all Q2_K, Q4_K, Q5_K or Q6_K, and Q8_0 with Q4_0. gguf-py has no
K-quant writer, so the blocks are random bytes with sane scales (any bit pattern is a valid
block); the reference is the same model with every tensor dequantized by gguf-py.

    .cache/venv/bin/python scripts/reference/make_kquant_gguf.py OUT_DIR

Writes OUT_DIR/{kind}.gguf, each with its reference {kind}-f32.gguf, and iq4_xs.gguf (a type
not read). KQ_SEED changes the random blocks (default 7).
"""

import sys
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = ROOT / ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, VOCAB = 256, 512, 2, 4, 2, 49152
rng = np.random.default_rng(7)


def f16_bytes(values):
    return np.asarray(values, dtype=np.float16).view(np.uint8).reshape(-1, 2)


def random_blocks(qtype, rows, cols):
    """`rows x cols` weights of `qtype` as raw blocks, scales set so weights stay within ~0.1-0.3."""
    block, size = GGML_QUANT_SIZES[qtype]
    n = rows * cols // block
    b = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    # Scales as a trained model's: weights of a few hundredths (larger random ones make a
    # chaotic network whose logits no quantization could keep).
    if qtype in (T.Q4_K, T.Q5_K):  # d, dmin first; Q5_K's codes go twice as high: half the d
        step = 1.0 if qtype == T.Q4_K else 0.5
        b[:, 0:2] = f16_bytes(rng.uniform(1e-5, 3e-5, n) * step)
        b[:, 2:4] = f16_bytes(rng.uniform(1e-5, 3e-5, n))
    elif qtype == T.Q6_K:  # int8 scales of 16 weights at 192..208, d last
        # Neighbouring 16-weight groups of a trained matrix get similar scales: pairs here.
        scales = rng.integers(40, 127, size=(n, 8)) * rng.choice([-1, 1], size=(n, 8))
        b[:, 192:208] = np.repeat(scales, 2, axis=1).astype(np.int8).view(np.uint8)
        b[:, -2:] = f16_bytes(rng.uniform(2e-6, 6e-6, n))
    elif qtype == T.Q3_K:  # hmask, qs, 12 bytes of sixteen 6-bit scales (32 = zero), d last
        # Pairs of similar scales (the two 16-weight halves of 32 neighbours: a trained matrix's
        # differ by a few), of either sign.
        magnitude = np.repeat(rng.integers(12, 29, size=(n, 8)), 2, axis=1) + rng.integers(-3, 4, size=(n, 16))
        scales = (magnitude * np.repeat(rng.choice([-1, 1], size=(n, 8)), 2, axis=1) + 32).astype(np.uint8)
        packed = np.zeros((n, 12), dtype=np.uint8)
        for j in range(16):  # ggml's layout: low nibbles in bytes 0-7, high 2 bits in 8-11
            low, high = scales[:, j] & 0xF, scales[:, j] >> 4
            packed[:, j % 8] |= low << (4 * (j // 8))
            packed[:, 8 + j % 4] |= high << (2 * (j // 4))
        b[:, 96:108] = packed
        b[:, -2:] = f16_bytes(rng.uniform(5e-5, 1.5e-4, n))
    elif qtype in (T.Q4_0, T.Q8_0, T.IQ4_XS):  # d first
        b[:, 0:2] = f16_bytes(rng.uniform(2e-3, 6e-3, n) if qtype == T.Q4_0 else rng.uniform(1e-4, 3e-4, n))
    elif qtype == T.Q2_K:  # 4-bit scale and min of 16 weights at 0..16, d, dmin last
        b[:, 0:16] = np.repeat(b[:, 0:8], 2, axis=1)
        b[:, -4:-2] = f16_bytes(rng.uniform(2e-4, 6e-4, n))
        b[:, -2:] = f16_bytes(rng.uniform(1e-4, 3e-4, n))
    return b.reshape(rows, cols // block * size)


# Each kind's main type and the type of its "important" tensors (attn_v, ffn_down, output).
KINDS = {"q4_k_m": (T.Q4_K, T.Q6_K), "q5_k_m": (T.Q5_K, T.Q6_K), "q3_k_m": (T.Q3_K, T.Q4_K),
         "q2_k": (T.Q2_K, T.Q2_K), "q4_k": (T.Q4_K, T.Q4_K), "q5_k": (T.Q5_K, T.Q5_K), "q6_k": (T.Q6_K, T.Q6_K),
         "q8_0": (T.Q8_0, T.Q4_0), "iq4_xs": (T.Q4_K, T.IQ4_XS)}


def tensors(kind):
    """(name, qtype, rows, cols) of the model, for a kind of KINDS."""
    main, high = KINDS[kind]
    q, kv = HEADS * 64, KV_HEADS * 64
    out = [("token_embd.weight", main, VOCAB, HIDDEN), ("output.weight", high, VOCAB, HIDDEN)]
    for l in range(LAYERS):
        p = f"blk.{l}"
        out += [(f"{p}.attn_q.weight", main, q, HIDDEN), (f"{p}.attn_k.weight", main, kv, HIDDEN),
                (f"{p}.attn_v.weight", high, kv, HIDDEN), (f"{p}.attn_output.weight", main, HIDDEN, q),
                (f"{p}.ffn_gate.weight", main, FFN, HIDDEN), (f"{p}.ffn_up.weight", main, FFN, HIDDEN),
                (f"{p}.ffn_down.weight", high, HIDDEN, FFN)]
    return out


def copy_tokenizer(reader, writer):
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY:
            writer.add_array(key, field.contents())
        elif vtype == GGUFValueType.STRING:
            writer.add_string(key, field.contents())
        else:
            writer.add_key_value(key, field.contents(), vtype)


def write(path, kind, reader, dequantized):
    w = GGUFWriter(str(path), "llama")
    w.add_context_length(2048)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(64)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)
    copy_tokenizer(reader, w)
    for l in range(LAYERS):
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{l}.{norm}.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    for name, qtype, blocks in dequantized:
        if path.stem.endswith("-f32"):
            w.add_tensor(name, dequantize(blocks, qtype).astype(np.float32))
        else:
            w.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    reader = GGUFReader(str(SMOLLM2))
    for kind in KINDS:
        global rng
        rng = np.random.default_rng(int(__import__("os").environ.get("KQ_SEED", "7")))
        blocks = [(name, qtype, random_blocks(qtype, rows, cols)) for name, qtype, rows, cols in tensors(kind)]
        norms_seed = rng.bit_generator.state
        for suffix in ("", "-f32") if kind != "iq4_xs" else ("",):
            rng.bit_generator.state = norms_seed  # the same norms in both files
            write(out / f"{kind}{suffix}.gguf", kind, reader, blocks)
        print("wrote", out / f"{kind}.gguf")


if __name__ == "__main__":
    main()
