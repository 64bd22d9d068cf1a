//! Tiny models that write one fixed answer: to test what the server makes of a model family's
//! output format (Harmony channels, XML tool calls) through real client packages, without a
//! real model. The weights are computed, not trained: one layer whose attention and MLP
//! are zero, so the hidden state is the last token's embedding, and an output head whose row
//! for each scripted token points at the embedding of the token before it. Greedy or sampled,
//! the model writes `trigger`'s successor, then the next, to the end of the script. Every
//! token of the script must be distinct (a token has one successor).
//!
//! The vocabulary is the tiny byte-level one (`synthetic::tokenizer_json`) plus the format's
//! special tokens and each multi-byte piece of the script as an added token (printable ASCII
//! only: the byte-level decoder knows no other characters; a space or newline is a byte token).

use std::collections::HashMap;
use std::path::Path;

use mlx_rs::Array;
use serde_json::{json, Value};

use crate::model::error::{ModelError, Result};
use crate::model::synthetic;
use crate::sampling::Rng;

const HIDDEN: usize = 128;

/// A model that answers with a turn's `answer` whenever the prompt ends with its `trigger`.
pub struct Script<'a> {
    pub chat_template: &'a str,
    /// The format's special tokens (their text is hidden unless the server asks for it).
    pub special: &'a [&'a str],
    pub turns: Vec<Turn<'a>>,
    /// What ends an answer (the first is written after each; all stop generation).
    pub eos: &'a [&'a str],
    /// The tokenizer (`tokenizer.json`) the script's pieces are added to; `None`: the tiny
    /// byte-level one. A real one (SmolLM2's) keeps long prompts as short as a real model's.
    pub tokenizer: Option<Value>,
}

/// One scripted answer.
pub struct Turn<'a> {
    /// The prompt's last token: a special token, a script token, or one byte.
    pub trigger: &'a str,
    /// The answer, one token per piece.
    pub answer: Vec<&'a str>,
}

/// What [`hermes_round_trip`]'s chat template writes after the generation prompt when the last
/// message is a tool result: the trigger of the final answer.
pub const AFTER_TOOL_RESULTS: &str = "<|after_tool_results|>";

/// Hermes tool calls (Qwen 2.5's format) for a whole agent turn: on a new request, the call
/// `call` (compact JSON `{"name": ..., "arguments": ...}`, printable ASCII with at most one
/// space); once the tool's result is in the prompt (the template then ends the prompt with
/// [`AFTER_TOOL_RESULTS`]), the final `answer` (printable ASCII, one piece).
pub fn hermes_round_trip<'a>(chat_template: &'a str, call: &'a str, answer: &'a str) -> Script<'a> {
    let mut call_pieces = vec!["<tool_call>"];
    for (k, part) in call.split(' ').enumerate() {
        if k > 0 {
            call_pieces.push(" ");
        }
        call_pieces.push(part);
    }
    call_pieces.push("</tool_call>");
    Script {
        chat_template,
        special: &["<|im_start|>", "<|im_end|>", "<|endoftext|>", AFTER_TOOL_RESULTS],
        turns: vec![
            Turn { trigger: "\n", answer: call_pieces },
            Turn { trigger: AFTER_TOOL_RESULTS, answer: vec![answer] },
        ],
        eos: &["<|im_end|>"],
        tokenizer: None,
    }
}

/// gpt-oss's Harmony format (its published chat template): a call to `get_weather`.
pub fn harmony_tool_call(chat_template: &str) -> Script<'_> {
    Script {
        chat_template,
        special: &[
            "<|startoftext|>",
            "<|start|>",
            "<|end|>",
            "<|message|>",
            "<|channel|>",
            "<|constrain|>",
            "<|return|>",
            "<|call|>",
        ],
        turns: vec![Turn {
            trigger: "assistant",
            answer: vec![
                "<|channel|>",
                "commentary",
                " ",
                "to=functions.get_weather",
                "<|constrain|>",
                "json",
                "<|message|>",
                r#"{"city":"Paris"}"#,
            ],
        }],
        tokenizer: None,
        eos: &["<|call|>", "<|return|>"],
    }
}

/// Qwen3-Coder's XML tool calls (its published chat template): a call to `get_weather` with a
/// string and an integer parameter.
pub fn qwen_xml_tool_call(chat_template: &str) -> Script<'_> {
    Script {
        chat_template,
        special: &["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
        turns: vec![Turn {
            trigger: "\n",
            answer: vec![
                "<tool_call>",
                "<function=get_weather><parameter=city>Paris</parameter><parameter=days>3</parameter></function>",
                "</tool_call>",
            ],
        }],
        tokenizer: None,
        eos: &["<|im_end|>"],
    }
}

/// Qwen3.5's and 3.6's tool calls (their published chat template, thinking on by default: the
/// prompt ends inside an open `<think>`): a thought, then Qwen3-Coder's XML call. (`</think>`
/// is an added token that is not special, as in Qwen's tokenizers: its text is always shown.)
pub fn qwen3_5_tool_call(chat_template: &str) -> Script<'_> {
    Script {
        chat_template,
        special: &["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
        turns: vec![Turn {
            trigger: "\n",
            answer: vec![
                "Calling_get_weather.",
                "</think>",
                "<tool_call>",
                "<function=get_weather><parameter=city>Paris</parameter><parameter=days>3</parameter></function>",
                "</tool_call>",
            ],
        }],
        tokenizer: None,
        eos: &["<|im_end|>"],
    }
}

/// Mistral v0.3's tool calls (its published chat template): `[TOOL_CALLS] [` and a JSON list
/// of one call, written compactly (a script cannot hold a token twice).
pub fn mistral_tool_call(chat_template: &str) -> Script<'_> {
    Script {
        chat_template,
        special: &[
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[TOOL_CALLS]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ],
        turns: vec![Turn {
            trigger: "[/INST]",
            answer: vec![
                "[TOOL_CALLS]",
                " ",
                r#"[{"name":"get_weather","#,
                r#""arguments":{"city":"Paris","#,
                r#""days":3}}]"#,
            ],
        }],
        tokenizer: None,
        eos: &["</s>"],
    }
}

/// LFM2's Python-list tool calls (its published chat template): a call to `get_weather` with a
/// string and an integer argument.
pub fn pythonic_tool_call(chat_template: &str) -> Script<'_> {
    Script {
        chat_template,
        special: &[
            "<|startoftext|>",
            "<|im_start|>",
            "<|im_end|>",
            "<|tool_list_start|>",
            "<|tool_list_end|>",
            "<|tool_call_start|>",
            "<|tool_call_end|>",
            "<|tool_response_start|>",
            "<|tool_response_end|>",
        ],
        turns: vec![Turn {
            trigger: "\n",
            answer: vec!["<|tool_call_start|>", r#"[get_weather(city="Paris",days=3)]"#, "<|tool_call_end|>"],
        }],
        tokenizer: None,
        eos: &["<|im_end|>"],
    }
}

/// Gemma 4's tool calls (its published chat template, thinking off: the prompt ends with an
/// empty thought): a short remark, then a call to `get_weather` with an integer argument (a
/// string argument would need its quote token twice, which a script cannot hold).
pub fn gemma4_tool_call(chat_template: &str) -> Script<'_> {
    Script {
        chat_template,
        special: &[
            "<bos>",
            "<|turn>",
            "<turn|>",
            "<|think|>",
            "<|channel>",
            "<channel|>",
            "<|tool>",
            "<tool|>",
            "<|tool_call>",
            "<tool_call|>",
            "<|tool_response>",
            "<tool_response|>",
            "<|\"|>",
        ],
        turns: vec![Turn {
            trigger: "<channel|>",
            answer: vec!["Checking.", "<|tool_call>", "call:get_weather{days:3}", "<tool_call|>"],
        }],
        tokenizer: None,
        eos: &["<|tool_response>", "<turn|>"],
    }
}

/// Writes the scripted model to `dir`.
pub fn write_scripted_model(dir: &Path, script: &Script) -> Result<()> {
    let io = |e: std::io::Error| ModelError::Io { path: dir.to_path_buf(), source: e };
    std::fs::create_dir_all(dir).map_err(io)?;
    let bad_tokenizer = |message: String| ModelError::Config { path: dir.join("tokenizer.json"), message };
    let mut tokenizer = script.tokenizer.clone().unwrap_or_else(synthetic::tokenizer_json);
    let byte_ids = byte_ids(&tokenizer).ok_or_else(|| bad_tokenizer("not a byte-level BPE vocabulary".into()))?;
    let Some(added) = tokenizer["added_tokens"].as_array_mut() else {
        return Err(bad_tokenizer("no added_tokens list".into()));
    };
    let mut ids: HashMap<String, usize> =
        added.iter().filter_map(|t| Some((t["content"].as_str()?.to_string(), t["id"].as_u64()? as usize))).collect();
    // New tokens go after the vocabulary and every token added before.
    let mut next_id = ids.values().copied().chain(byte_ids.values().copied()).max().unwrap_or(0) + 1;
    if let Some(vocab) = script.tokenizer.as_ref().and_then(|t| t["model"]["vocab"].as_object()) {
        next_id = next_id.max(vocab.values().filter_map(Value::as_u64).max().unwrap_or(0) as usize + 1);
    }
    let pieces = script.turns.iter().flat_map(|turn| std::iter::once(&turn.trigger).chain(&turn.answer));
    for piece in script.special.iter().chain(pieces).chain(script.eos) {
        if ids.contains_key(*piece) || byte_ids.contains_key(*piece) {
            continue;
        }
        if piece.is_empty() || !piece.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ModelError::Config {
                path: dir.to_path_buf(),
                message: format!("script piece {piece:?}: printable ASCII only (not empty), or a single byte"),
            });
        }
        let id = next_id;
        next_id += 1;
        let special = script.special.contains(piece);
        added.push(json!({"id": id, "content": piece, "single_word": false, "lstrip": false, "rstrip": false,
                          "normalized": false, "special": special}));
        ids.insert(piece.to_string(), id);
    }
    let vocab = next_id;
    let id = |piece: &str| ids.get(piece).or_else(|| byte_ids.get(piece)).copied().expect("every piece has an id");
    // Each turn's chain: the trigger, the answer, the end. A token has one successor, so no
    // token may appear twice in all the chains (the end excepted: nothing follows it).
    let chains: Vec<Vec<usize>> = script
        .turns
        .iter()
        .map(|turn| {
            std::iter::once(turn.trigger)
                .chain(turn.answer.iter().copied())
                .chain(script.eos.first().copied())
                .map(id)
                .collect()
        })
        .collect();
    let mut seen = std::collections::HashSet::new();
    if let Some(repeat) = chains.iter().flat_map(|chain| &chain[..chain.len() - 1]).find(|t| !seen.insert(**t)) {
        return Err(ModelError::Config {
            path: dir.to_path_buf(),
            message: format!("token {repeat} appears twice in the script: it can have only one successor"),
        });
    }

    let write_json = |name: &str, value: &Value| -> Result<()> {
        let text = serde_json::to_string_pretty(value).expect("JSON values serialise");
        std::fs::write(dir.join(name), text).map_err(|source| ModelError::Io { path: dir.join(name), source })
    };
    let eos_ids: Vec<usize> = script.eos.iter().map(|e| id(e)).collect();
    write_json(
        "config.json",
        &json!({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": vocab,
            "hidden_size": HIDDEN, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
            "num_key_value_heads": 4, "rms_norm_eps": 1e-5, "max_position_embeddings": 65536,
            "tie_word_embeddings": false, "eos_token_id": eos_ids, "torch_dtype": "float32"}),
    )?;
    write_json("tokenizer.json", &tokenizer)?;
    write_json(
        "tokenizer_config.json",
        &json!({"eos_token": script.eos[0], "chat_template": script.chat_template,
                "tokenizer_class": "PreTrainedTokenizerFast"}),
    )?;
    write_json("generation_config.json", &json!({"eos_token_id": eos_ids}))?;

    // Embeddings: random directions (nearly orthogonal in 128 dimensions). The head's row for
    // each scripted token is its predecessor's direction, scaled so its logit (~45) dwarfs
    // every other (a cosine of at most ~0.3 of it, or 0).
    let mut rng = Rng::seeded(11);
    let embed: Vec<f32> = (0..vocab * HIDDEN).map(|_| 2.0 * rng.next_f64() as f32 - 1.0).collect();
    let mut head = vec![0f32; vocab * HIDDEN];
    for pair in chains.iter().flat_map(|chain| chain.windows(2)) {
        let (from, to) = (pair[0], pair[1]);
        let row = &embed[from * HIDDEN..][..HIDDEN];
        let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt();
        // `+=`: the end follows the last token of every turn (the directions are near orthogonal).
        for (h, x) in head[to * HIDDEN..][..HIDDEN].iter_mut().zip(row) {
            *h += 4.0 * x / norm;
        }
    }
    let zeros = |rows: usize, cols: usize| Array::from_slice(&vec![0f32; rows * cols], &[rows as i32, cols as i32]);
    let ones = Array::from_slice(&[1f32; HIDDEN], &[HIDDEN as i32]);
    let mut arrays: HashMap<String, Array> = HashMap::new();
    arrays.insert("model.embed_tokens.weight".into(), Array::from_slice(&embed, &[vocab as i32, HIDDEN as i32]));
    arrays.insert("lm_head.weight".into(), Array::from_slice(&head, &[vocab as i32, HIDDEN as i32]));
    arrays.insert("model.norm.weight".into(), ones.clone());
    let p = "model.layers.0";
    arrays.insert(format!("{p}.input_layernorm.weight"), ones.clone());
    arrays.insert(format!("{p}.post_attention_layernorm.weight"), ones);
    for name in ["q_proj", "k_proj", "v_proj", "o_proj"] {
        arrays.insert(format!("{p}.self_attn.{name}.weight"), zeros(HIDDEN, HIDDEN));
    }
    arrays.insert(format!("{p}.mlp.gate_proj.weight"), zeros(64, HIDDEN));
    arrays.insert(format!("{p}.mlp.up_proj.weight"), zeros(64, HIDDEN));
    arrays.insert(format!("{p}.mlp.down_proj.weight"), zeros(HIDDEN, 64));
    let path = dir.join("model.safetensors");
    let metadata = HashMap::from([("format".to_string(), "mlx".to_string())]);
    Array::save_safetensors(arrays, &metadata, &path).map_err(|e| ModelError::Weights { path, message: e.to_string() })
}

/// Each single-byte string's token id in the byte-level vocabulary (`None`: not one).
fn byte_ids(tokenizer: &Value) -> Option<HashMap<String, usize>> {
    let vocab = tokenizer["model"]["vocab"].as_object()?;
    let alphabet: HashMap<&str, usize> =
        vocab.iter().filter_map(|(symbol, id)| Some((symbol.as_str(), id.as_u64()? as usize))).collect();
    let ids = (0u8..=127).filter_map(|b| {
        // The vocabulary lists each byte by its symbol in GPT-2's byte-level alphabet (SmolLM2's
        // lacks a few control bytes, which no script writes).
        let symbol = synthetic::byte_symbol(b);
        alphabet.get(symbol.to_string().as_str()).map(|&id| ((b as char).to_string(), id))
    });
    Some(ids.collect::<HashMap<_, _>>()).filter(|ids| ids.contains_key(" ") && ids.contains_key("\n"))
}
