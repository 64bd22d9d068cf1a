//! Checkpoints that wrap a text model in a multimodal one (Gemma 3 `gemma3`, Mistral Small 3.x
//! `mistral3`): the text model's config is nested in `text_config` and its tensors live under
//! `language_model.`; the vision tower and projector are not loaded. Also the tensor renames
//! the families need to reach the shared transformer's names.

use serde_json::Value;

/// The text model's config: `raw` itself, or its `text_config` completed from the outer config
/// (vocabulary, tokens, quantization) as the reference does; then the family's defaults for
/// what its published configs leave out.
pub fn text_config(raw: &Value) -> Value {
    let mut text = unwrapped(raw);
    if let Some(fields) = text.as_object_mut() {
        if matches!(fields.get("model_type").and_then(Value::as_str), Some("lfm2" | "lfm2_moe")) {
            lfm2_fields(fields);
        }
        if fields.get("model_type").and_then(Value::as_str) == Some("gemma4_text") {
            // The reference's defaults (mlx-lm's gemma4_text ModelArgs).
            for (key, value) in [
                ("head_dim", Value::from(256)),
                ("max_position_embeddings", Value::from(131_072)),
                ("rms_norm_eps", Value::from(1e-6)),
            ] {
                fields.entry(key).or_insert(value);
            }
        }
        if fields.get("model_type").and_then(Value::as_str) == Some("gemma3_text") {
            // Gemma 3's multimodal configs state little of the text model: these are
            // transformers' Gemma3TextConfig defaults.
            for (key, value) in [
                ("head_dim", Value::from(256)),
                ("rope_theta", Value::from(1_000_000.0)),
                ("max_position_embeddings", Value::from(131_072)),
                ("rms_norm_eps", Value::from(1e-6)),
            ] {
                fields.entry(key).or_insert(value);
            }
        }
    }
    text
}

/// LFM2's names for the common fields, as the reference reads them: its norms' `norm_eps`, an
/// MLP width derived from `block_ff_dim` (two thirds of it, times the multiplier, rounded up to
/// `block_multiple_of`, when `block_auto_adjust_ff_dim`), the attention layers' indices as
/// layer types, and embeddings always tied.
fn lfm2_fields(fields: &mut serde_json::Map<String, Value>) {
    let number = |fields: &serde_json::Map<String, Value>, key: &str| fields.get(key).and_then(Value::as_f64);
    if let Some(eps) = number(fields, "norm_eps") {
        fields.insert("rms_norm_eps".into(), Value::from(eps));
    }
    // LFM2-MoE's dense layers are `intermediate_size` wide, whatever its `block_*` fields say.
    let moe = fields.get("model_type").and_then(Value::as_str) == Some("lfm2_moe");
    let width = if moe { None } else { number(fields, "block_ff_dim") };
    if let Some(width) = width.or_else(|| number(fields, "intermediate_size")) {
        let mut width = width as u64;
        if !moe && fields.get("block_auto_adjust_ff_dim").and_then(Value::as_bool).unwrap_or(false) {
            width = 2 * width / 3;
            if let Some(multiplier) = number(fields, "block_ffn_dim_multiplier") {
                width = (multiplier * width as f64) as u64;
            }
            let multiple = number(fields, "block_multiple_of").unwrap_or(1.0).max(1.0) as u64;
            width = width.div_ceil(multiple) * multiple;
        }
        fields.insert("intermediate_size".into(), Value::from(width));
    }
    let layers = number(fields, "num_hidden_layers").unwrap_or(0.0) as usize;
    if let Some(full) = fields.get("full_attn_idxs").and_then(Value::as_array).cloned() {
        let full: Vec<usize> = full.iter().filter_map(Value::as_u64).map(|i| i as usize).collect();
        let types: Vec<Value> =
            (0..layers).map(|l| Value::from(if full.contains(&l) { "full_attention" } else { "conv" })).collect();
        fields.insert("layer_types".into(), Value::Array(types));
    }
    fields.insert("tie_word_embeddings".into(), Value::from(true));
    if let Some(theta) = fields.get("rope_parameters").and_then(|r| r.get("rope_theta")).cloned() {
        fields.insert("rope_theta".into(), theta);
    }
    fields.entry("rope_theta").or_insert(Value::from(1_000_000.0));
}

fn unwrapped(raw: &Value) -> Value {
    let outer = raw.get("model_type").and_then(Value::as_str).unwrap_or_default();
    let Some(inner) = raw.get("text_config").and_then(Value::as_object) else { return raw.clone() };
    let mut text = inner.clone();
    let default_type = match outer {
        "gemma3" => "gemma3_text",
        "gemma4" => "gemma4_text",
        "mistral3" => "mistral",
        other => other,
    };
    text.entry("model_type").or_insert_with(|| Value::from(default_type));
    if outer == "gemma3" {
        // Gemma 3's outer config owns the vocabulary and the head counts' defaults.
        text.insert("vocab_size".into(), raw.get("vocab_size").cloned().unwrap_or(Value::from(262_208)));
        text.entry("num_attention_heads").or_insert(Value::from(8));
        text.entry("num_key_value_heads").or_insert(Value::from(4));
    }
    if outer == "gemma4" {
        // As the reference: the outer config owns the vocabulary; head counts default small.
        text.insert("vocab_size".into(), raw.get("vocab_size").cloned().unwrap_or(Value::from(262_144)));
        text.entry("num_attention_heads").or_insert(Value::from(8));
        text.entry("num_key_value_heads").or_insert(Value::from(1));
    }
    if outer == "mistral3" {
        text.entry("tie_word_embeddings").or_insert(Value::from(false));
    }
    if text.get("model_type").and_then(Value::as_str) == Some("ministral3") {
        // The reference's defaults for what Ministral 3's configs may leave out.
        text.entry("tie_word_embeddings").or_insert(Value::from(true));
    }
    for key in ["quantization", "quantization_config", "eos_token_id", "bos_token_id", "torch_dtype", "dtype"] {
        if let Some(v) = raw.get(key) {
            text.entry(key).or_insert_with(|| v.clone());
        }
    }
    Value::Object(text)
}

/// The name a checkpoint tensor has in the shared transformer's layout, or `None` for a
/// tensor nothing reads (precomputed rotary tables, vision weights).
pub fn canonical_tensor_name(name: &str) -> Option<String> {
    // A multi-token-prediction head (Qwen3-Next, Qwen3.5) keeps its own names, wherever a
    // wrapper puts it.
    if let Some(at) = name.find(".mtp.") {
        return Some(name[at + 1..].to_string());
    }
    if name.starts_with("mtp.") {
        return Some(name.to_string());
    }
    if name.contains("rotary_emb.inv_freq")
        || [
            "vision_tower",
            "multi_modal_projector",
            "vision_model",
            "audio_tower",
            "embed_audio",
            "embed_vision",
            "vision_embedder",
            "model.visual.",
        ]
        .iter()
        .any(|p| name.contains(p))
    {
        return None;
    }
    let name = if let Some(rest) = name.strip_prefix("model.language_model.") {
        format!("model.{rest}")
    } else {
        name.strip_prefix("language_model.").unwrap_or(name).to_string()
    };
    Some(expert_bias_name(lfm2_names(gpt_oss_names(mixtral_names(name)))))
}

/// The bias that joins the scores choosing experts, wherever a family keeps it (DeepSeek's and
/// GLM's on the router, `mlp.gate.e_score_correction_bias`; MiniMax's on the block) -> LFM2's
/// name for it, `mlp.expert_bias`.
fn expert_bias_name(name: String) -> String {
    for from in [".mlp.gate.e_score_correction_bias", ".mlp.e_score_correction_bias"] {
        if let Some(head) = name.strip_suffix(from) {
            return format!("{head}.mlp.expert_bias");
        }
    }
    name
}

/// LFM2's names -> the shared layout's (its short convolutions keep theirs: `conv.*`): its
/// `feed_forward` is the `mlp` (LFM2-MoE's router `gate`, `expert_bias`, `switch_mlp` or
/// `experts.{e}` included), whose `w1`/`w3`/`w2` are the gate/up/down projections.
fn lfm2_names(name: String) -> String {
    const RENAMES: [(&str, &str); 6] = [
        (".operator_norm.", ".input_layernorm."),
        (".ffn_norm.", ".post_attention_layernorm."),
        (".self_attn.out_proj.", ".self_attn.o_proj."),
        (".self_attn.q_layernorm.", ".self_attn.q_norm."),
        (".self_attn.k_layernorm.", ".self_attn.k_norm."),
        ("model.embedding_norm.", "model.norm."),
    ];
    let name = RENAMES.iter().fold(name, |n, (from, to)| if n.contains(from) { n.replace(from, to) } else { n });
    if !name.contains(".feed_forward.") {
        return name;
    }
    const PROJECTIONS: [(&str, &str); 3] = [(".w1.", ".gate_proj."), (".w3.", ".up_proj."), (".w2.", ".down_proj.")];
    let name = name.replace(".feed_forward.", ".mlp.");
    PROJECTIONS.iter().fold(name, |n, (from, to)| n.replace(from, to))
}

/// gpt-oss as MLX saves it: `mlp.router` and stacked `mlp.experts.{gate,up,down}_proj` (no
/// expert number) -> `mlp.gate` and `mlp.switch_mlp.*`.
fn gpt_oss_names(name: String) -> String {
    let name = name.replace(".mlp.router.", ".mlp.gate.");
    ["gate_proj", "up_proj", "down_proj"]
        .iter()
        .fold(name, |n, proj| n.replace(&format!(".mlp.experts.{proj}."), &format!(".mlp.switch_mlp.{proj}.")))
}

/// Mixtral's `block_sparse_moe` with experts' `w1`/`w2`/`w3` -> `mlp` with
/// `gate_proj`/`down_proj`/`up_proj`.
fn mixtral_names(name: String) -> String {
    if !name.contains(".block_sparse_moe.") {
        return name;
    }
    let name = name.replace(".block_sparse_moe.", ".mlp.");
    let Some(at) = name.find(".experts.") else { return name };
    let (head, tail) = name.split_at(at);
    let tail = tail.replace(".w1.", ".gate_proj.").replace(".w2.", ".down_proj.").replace(".w3.", ".up_proj.");
    format!("{head}{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wrapped_and_family_names_reach_the_shared_layout() {
        let cases = [
            ("language_model.model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.gate_proj.weight"),
            ("model.language_model.embed_tokens.weight", "model.embed_tokens.weight"),
            ("language_model.lm_head.weight", "lm_head.weight"),
            ("model.layers.3.block_sparse_moe.gate.weight", "model.layers.3.mlp.gate.weight"),
            ("model.layers.3.mlp.gate.e_score_correction_bias", "model.layers.3.mlp.expert_bias"),
            ("model.layers.3.block_sparse_moe.e_score_correction_bias", "model.layers.3.mlp.expert_bias"),
            ("model.layers.3.block_sparse_moe.experts.7.w1.weight", "model.layers.3.mlp.experts.7.gate_proj.weight"),
            ("model.layers.3.block_sparse_moe.experts.7.w2.scales", "model.layers.3.mlp.experts.7.down_proj.scales"),
            (
                "model.layers.3.block_sparse_moe.switch_mlp.up_proj.weight",
                "model.layers.3.mlp.switch_mlp.up_proj.weight",
            ),
        ];
        for (from, to) in cases {
            assert_eq!(canonical_tensor_name(from).as_deref(), Some(to), "{from}");
        }
        assert_eq!(canonical_tensor_name("vision_tower.encoder.layers.0.mlp.fc1.weight"), None);
        assert_eq!(canonical_tensor_name("model.multi_modal_projector.linear_1.weight"), None);
        assert_eq!(canonical_tensor_name("model.layers.0.self_attn.rotary_emb.inv_freq"), None);
        assert_eq!(
            canonical_tensor_name("mtp.layers.0.mlp.gate.weight").as_deref(),
            Some("mtp.layers.0.mlp.gate.weight")
        );
        assert_eq!(canonical_tensor_name("model.language_model.mtp.fc.weight").as_deref(), Some("mtp.fc.weight"));
    }

    #[test]
    fn a_nested_text_config_takes_the_outer_vocabulary_and_quantization() {
        let raw = json!({"model_type": "gemma3", "vocab_size": 1000, "quantization": {"bits": 4, "group_size": 64},
                         "text_config": {"hidden_size": 64}});
        let text = text_config(&raw);
        assert_eq!(text["model_type"], "gemma3_text");
        assert_eq!(text["vocab_size"], 1000);
        assert_eq!(text["num_attention_heads"], 8);
        assert_eq!(text["quantization"]["bits"], 4);
        let plain = json!({"model_type": "llama", "hidden_size": 64});
        assert_eq!(text_config(&plain), plain);
    }
}
