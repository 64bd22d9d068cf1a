//! How a Hub repository's weights are stored, told from what a search listing carries (no extra
//! request per hit): GGUF file names, the repo name (mlx-community's `-4bit`, `-bf16`, `-4bit-DWQ`,
//! `-mxfp4`, GGUF's `Q4_K_M`), the tags (`4-bit`, `fp8`), and last the safetensors dtypes.
//! The names are a convention, not a promise: the label is a hint for choosing what to download;
//! the model's config, read once it is here, is what loading goes by.

use std::collections::BTreeMap;

/// At most this many GGUF quantizations are named; the rest are counted.
const MAX_GGUF_LISTED: usize = 6;

/// A short label such as `4-bit`, `4-bit DWQ`, `BF16`, `MXFP4`, `Q4_K_M`, `GGUF Q4_K_M, Q8_0`;
/// `None` when nothing tells.
pub fn quantization_label(
    id: &str,
    tags: &[String],
    dtypes: &BTreeMap<String, u64>,
    files: &[String],
) -> Option<String> {
    gguf_files_label(files)
        .or_else(|| name_label(id.rsplit('/').next().unwrap_or(id)))
        .or_else(|| tags.iter().find_map(|t| tag_label(t)))
        .or_else(|| dtype_label(dtypes))
}

/// The quantizations among a repo's `.gguf` files, smallest bits first.
fn gguf_files_label(files: &[String]) -> Option<String> {
    let mut quants: Vec<String> = Vec::new();
    for file in files.iter().filter(|f| f.to_ascii_lowercase().ends_with(".gguf")) {
        let stem = file.rsplit('/').next().unwrap_or(file);
        let stem = &stem[..stem.len() - ".gguf".len()];
        // Split shards (`-00001-of-00003`) name the same quantization.
        let quant = |t: &str| {
            gguf_quant(t).or_else(|| {
                float_format(&t.to_ascii_lowercase())
                    .filter(|f| matches!(*f, "F16" | "F32" | "BF16"))
                    .map(str::to_string)
            })
        };
        if let Some(q) = name_tokens(stem).rev().find_map(quant) {
            if !quants.contains(&q) {
                quants.push(q);
            }
        }
    }
    if quants.is_empty() {
        return None;
    }
    quants.sort_by_key(|q| (gguf_bits(q), q.clone()));
    let shown: Vec<&str> = quants.iter().take(MAX_GGUF_LISTED).map(String::as_str).collect();
    let more = quants.len().saturating_sub(MAX_GGUF_LISTED);
    Some(if more > 0 { format!("GGUF {} +{more}", shown.join(", ")) } else { format!("GGUF {}", shown.join(", ")) })
}

/// Name parts, split where repo and file names separate them.
fn name_tokens(name: &str) -> impl DoubleEndedIterator<Item = &str> {
    name.split(['-', '.', ' ']).filter(|t| !t.is_empty())
}

/// What the repo name says, the last telling part winning (`Qwen3-4B-4bit-DWQ`, `...-8bit-mlx`).
fn name_label(name: &str) -> Option<String> {
    let tokens: Vec<&str> = name_tokens(name).collect();
    let dwq = tokens.iter().any(|t| t.eq_ignore_ascii_case("dwq"));
    tokens.iter().rev().find_map(|t| {
        let lower = t.to_ascii_lowercase();
        if let Some(bits) = bits_token(&lower) {
            return Some(if dwq { format!("{bits}-bit DWQ") } else { format!("{bits}-bit") });
        }
        float_format(&lower).map(str::to_string).or_else(|| gguf_quant(t))
    })
}

/// `4bit`, `4-bit` (as one tag), `q4`, `int4`, `w4a16`-free forms: the bit width.
fn bits_token(lower: &str) -> Option<u32> {
    let digits = lower
        .strip_suffix("bits")
        .or_else(|| lower.strip_suffix("bit"))
        .map(|d| d.strip_suffix('-').unwrap_or(d))
        .or_else(|| lower.strip_prefix("int"))
        .or_else(|| lower.strip_prefix('q').filter(|d| d.len() == 1))?;
    let bits: u32 = digits.parse().ok()?;
    (1..=8).contains(&bits).then_some(bits)
}

fn float_format(lower: &str) -> Option<&'static str> {
    Some(match lower {
        "bf16" | "bfloat16" => "BF16",
        "fp16" | "f16" | "float16" => "F16",
        "fp32" | "f32" | "float32" => "F32",
        "fp8" | "f8" => "FP8",
        "mxfp4" => "MXFP4",
        "nvfp4" => "NVFP4",
        "mxfp8" => "MXFP8",
        _ => return None,
    })
}

/// A GGUF quantization name: `Q4_K_M`, `Q8_0`, `IQ4_XS`, `Q4_0_4_4`, `TQ1_0` (upper-cased).
fn gguf_quant(token: &str) -> Option<String> {
    let upper = token.to_ascii_uppercase();
    let rest = upper.strip_prefix("IQ").or_else(|| upper.strip_prefix("TQ")).or_else(|| upper.strip_prefix('Q'))?;
    let mut parts = rest.split('_');
    let bits = parts.next()?;
    let has_suffix = rest.contains('_');
    let valid_bits = !bits.is_empty() && bits.len() <= 1 && bits.chars().all(|c| c.is_ascii_digit());
    let valid_rest = parts.all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric()));
    (valid_bits && has_suffix && valid_rest).then_some(upper)
}

/// Bit width of a GGUF quantization name (`Q4_K_M` → 4, `BF16` → 16), for ordering.
fn gguf_bits(quant: &str) -> u32 {
    if let Some(width) = quant.strip_prefix("BF").or_else(|| quant.strip_prefix('F')) {
        return width.parse().unwrap_or(16);
    }
    quant.chars().find(|c| c.is_ascii_digit()).and_then(|c| c.to_digit(10)).unwrap_or(16)
}

/// Hub tags that say it: `4-bit`, `8-bit` (added for bitsandbytes and others), `fp8`.
fn tag_label(tag: &str) -> Option<String> {
    let lower = tag.to_ascii_lowercase();
    if let Some(bits) = bits_token(&lower).filter(|_| lower.contains("bit")) {
        return Some(format!("{bits}-bit"));
    }
    matches!(lower.as_str(), "fp8" | "mxfp4" | "nvfp4").then(|| float_format(&lower).unwrap_or_default().to_string())
}

/// From the safetensors element counts by dtype: packed integers mean quantized weights (the bit
/// width is not recoverable without the config); otherwise the float type holding most elements.
fn dtype_label(dtypes: &BTreeMap<String, u64>) -> Option<String> {
    if dtypes.keys().any(|d| d == "U32" || d == "I32")
        && dtypes.keys().any(|d| matches!(d.as_str(), "BF16" | "F16" | "F32"))
    {
        return Some("quantized".into());
    }
    if dtypes.keys().any(|d| d.starts_with("F8_")) {
        return Some("FP8".into());
    }
    let (dtype, _) =
        dtypes.iter().filter(|(d, _)| matches!(d.as_str(), "BF16" | "F16" | "F32")).max_by_key(|(_, n)| **n)?;
    Some(dtype.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label(id: &str) -> Option<String> {
        quantization_label(id, &[], &BTreeMap::new(), &[])
    }

    #[test]
    fn mlx_community_names() {
        assert_eq!(label("mlx-community/Qwen2.5-0.5B-Instruct-4bit").as_deref(), Some("4-bit"));
        assert_eq!(label("mlx-community/Meta-Llama-3.1-8B-Instruct-8bit").as_deref(), Some("8-bit"));
        assert_eq!(label("mlx-community/Qwen3-4B-4bit-DWQ-053125").as_deref(), Some("4-bit DWQ"));
        assert_eq!(label("mlx-community/Llama-3.2-3B-Instruct-bf16").as_deref(), Some("BF16"));
        assert_eq!(label("mlx-community/phi-2-hf-4bit-mlx").as_deref(), Some("4-bit"));
        assert_eq!(label("mlx-community/gpt-oss-20b-MXFP4-Q8").as_deref(), Some("8-bit"));
        assert_eq!(label("mlx-community/Mistral-7B-Instruct-v0.3-3bit").as_deref(), Some("3-bit"));
        assert_eq!(label("someone/model-fp16").as_deref(), Some("F16"));
        // Size and version parts are not quantizations.
        assert_eq!(label("HuggingFaceTB/SmolLM2-135M-Instruct"), None);
        assert_eq!(label("Qwen/Qwen2.5-0.5B-Instruct"), None);
        assert_eq!(label("meta-llama/Llama-3.1-8B"), None);
        assert_eq!(label("microsoft/Phi-3.5-mini-instruct"), None);
    }

    #[test]
    fn gguf_names_and_files() {
        assert_eq!(label("bartowski/Llama-3.2-1B-Instruct-Q4_K_M-GGUF").as_deref(), Some("Q4_K_M"));
        let files: Vec<String> = [
            "README.md",
            "SmolLM2-135M-Instruct.Q8_0.gguf",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "SmolLM2-135M-Instruct-IQ4_XS.gguf",
            "big/Model-Q4_K_M-00001-of-00002.gguf",
            "big/Model-Q4_K_M-00002-of-00002.gguf",
            "SmolLM2-135M-Instruct.f16.gguf",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            quantization_label("x/SmolLM2-135M-Instruct-GGUF", &[], &BTreeMap::new(), &files).as_deref(),
            Some("GGUF IQ4_XS, Q4_1, Q4_K_M, Q8_0, F16")
        );
        let many: Vec<String> = ["Q2_K", "Q3_K_S", "Q3_K_M", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0"]
            .iter()
            .map(|q| format!("m-{q}.gguf"))
            .collect();
        assert_eq!(
            quantization_label("x/m-GGUF", &[], &BTreeMap::new(), &many).as_deref(),
            Some("GGUF Q2_K, Q3_K_M, Q3_K_S, Q4_0, Q4_K_M, Q5_K_M +2")
        );
    }

    #[test]
    fn tags_then_dtypes() {
        let tags = vec!["transformers".to_string(), "4-bit".to_string(), "bitsandbytes".to_string()];
        assert_eq!(quantization_label("a/b", &tags, &BTreeMap::new(), &[]).as_deref(), Some("4-bit"));
        let packed = BTreeMap::from([("BF16".to_string(), 40_000_000), ("U32".to_string(), 60_000_000)]);
        assert_eq!(quantization_label("a/b", &[], &packed, &[]).as_deref(), Some("quantized"));
        let plain = BTreeMap::from([("BF16".to_string(), 494_000_000), ("F32".to_string(), 1000)]);
        assert_eq!(quantization_label("a/b", &[], &plain, &[]).as_deref(), Some("BF16"));
        let fp8 = BTreeMap::from([("BF16".to_string(), 1000), ("F8_E4M3".to_string(), 7_000_000_000)]);
        assert_eq!(quantization_label("a/b", &[], &fp8, &[]).as_deref(), Some("FP8"));
        // The name wins over the dtypes: an MLX 4-bit repo stores U32 + BF16.
        assert_eq!(quantization_label("a/b-4bit", &[], &packed, &[]).as_deref(), Some("4-bit"));
        assert_eq!(quantization_label("a/b", &[], &BTreeMap::new(), &[]), None);
    }
}
