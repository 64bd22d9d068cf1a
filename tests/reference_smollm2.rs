//! SmolLM2-135M-Instruct against mlx-lm (tests/data/reference/*.json, made by the scripts in
//! scripts/reference/): same chat-template text, same prompt ids, and the same 64 greedy tokens,
//! from the Q4_1 GGUF and from its 4-bit MLX-layout export.

mod common;

use fastmlx::model::{load_model_with, LoadOptions, LoadedModel, WeightFormat};
use fastmlx::tokenizer::chat_template::RenderRequest;
use serde_json::Value;

/// Every case of `reference`, or (`some`) three of them: the shortest prompt, a middle one and
/// the longest. The packed runs take the sample: MLX's quantized kernels on a CPU are this file's
/// slowest path (~0.2 s a token here), and the dense run checks every case.
fn check_against_reference(model: &LoadedModel, reference: &Value, some: bool) {
    let template = model.chat_template.as_ref().expect("SmolLM2 ships a chat template");
    let cases = reference["cases"].as_array().unwrap();
    assert!(cases.len() >= 5);
    let mut by_length: Vec<&Value> = cases.iter().collect();
    by_length.sort_by_key(|c| c["prompt_ids"].as_array().map_or(0, Vec::len));
    let sample = [by_length[0], by_length[by_length.len() / 2], by_length[by_length.len() - 1]];
    let cases: Vec<&Value> = if some { sample.to_vec() } else { cases.iter().collect() };
    let mut mismatches = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let messages = case["messages"].as_array().unwrap();
        let text =
            template.render(&RenderRequest { messages, add_generation_prompt: true, ..Default::default() }).unwrap();
        assert_eq!(text, case["prompt_text"].as_str().unwrap(), "{name}: chat template text");
        let prompt_ids = model.tokenizer.encode(&text, false, true).unwrap();
        assert_eq!(prompt_ids, common::ids(&case["prompt_ids"]), "{name}: prompt ids");
        let expected = common::ids(&case["output_ids"]);
        let got = common::greedy(model, prompt_ids, expected.len()).tokens;
        if got != expected {
            let at = got.iter().zip(&expected).position(|(a, b)| a != b).unwrap_or(0);
            mismatches.push(format!(
                "{name}: first difference at token {at}: got {:?}, expected {:?}",
                &got[at..],
                &expected[at..]
            ));
        }
    }
    assert!(mismatches.is_empty(), "greedy tokens differ from mlx-lm:\n{}", mismatches.join("\n"));
}

fn load(path: &std::path::Path, weights: WeightFormat) -> LoadedModel {
    load_model_with(path, &common::backend(), &LoadOptions { weights }).unwrap()
}

/// Quantized weights kept packed (MLX's quantized kernels, the Metal path) vs mlx-lm on them.
#[test]
fn gguf_q4_1_packed_matches_mlx_lm_token_for_token() {
    let _mlx = common::mlx_lock();
    let model = load(&common::smollm2_gguf(), WeightFormat::Packed);
    check_against_reference(&model, &common::read_json("tests/data/reference/smollm2_q4_1_gguf.json"), true);
}

/// Quantized weights expanded to f32 at load (the CPU default) vs mlx-lm on the same
/// expanded weights.
#[test]
fn gguf_q4_1_dense_matches_mlx_lm_token_for_token() {
    let _mlx = common::mlx_lock();
    let model = load(&common::smollm2_gguf(), WeightFormat::Dense);
    check_against_reference(&model, &common::read_json("tests/data/reference/smollm2_q4_1_gguf_dense.json"), false);
}

#[test]
fn mlx_4bit_export_matches_mlx_lm_token_for_token() {
    let _mlx = common::mlx_lock();
    let dir = common::setup_file(".cache/models/SmolLM2-135M-Instruct-mlx-4bit");
    let model = load(&dir, WeightFormat::Packed);
    check_against_reference(&model, &common::read_json("tests/data/reference/smollm2_mlx_4bit.json"), true);
}
