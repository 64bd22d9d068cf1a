//! Single-stream generation on SmolLM2: EOS, stop strings, max tokens, and bad requests.

mod common;

use fastmlx::generate::{generate, FinishReason, GenerateError, GenerateRequest};
use fastmlx::model::{load_model, KvFormat, LoadedModel};
use fastmlx::sampling::SamplingParams;
use fastmlx::tokenizer::chat_template::RenderRequest;
use serde_json::json;

fn smollm2() -> LoadedModel {
    load_model(&common::smollm2_gguf(), &common::backend()).unwrap()
}

fn france_prompt(model: &LoadedModel) -> Vec<u32> {
    let messages = [json!({"role": "user", "content": "What is the capital of France?"})];
    let text = model
        .chat_template
        .as_ref()
        .unwrap()
        .render(&RenderRequest { messages: &messages, add_generation_prompt: true, ..Default::default() })
        .unwrap();
    model.tokenizer.encode(&text, false, true).unwrap()
}

fn request(prompt_ids: Vec<u32>, max_tokens: usize, stop: &[&str]) -> GenerateRequest {
    GenerateRequest {
        prompt_ids,
        params: SamplingParams::greedy(),
        max_tokens,
        stop: stop.iter().map(|s| s.to_string()).collect(),
        ignore_eos: false,
        kv_format: KvFormat::FULL,
    }
}

#[test]
fn eos_ends_generation_and_is_not_shown() {
    let _mlx = common::mlx_lock();
    let model = smollm2();
    let mut streamed = String::new();
    let g = generate(&model, &request(france_prompt(&model), 40, &[]), |t| streamed.push_str(t)).unwrap();
    assert_eq!(g.finish, FinishReason::Stop);
    assert_eq!(g.text, "The capital of France is Paris.");
    assert_eq!(streamed, g.text, "what streamed is what was generated");
    assert_eq!(g.tokens.last(), Some(&2), "ended on <|im_end|>");
    assert_eq!(g.stats.generated_tokens, g.tokens.len());
    assert!(g.stats.peak_memory > 0);
}

#[test]
fn stop_string_spanning_tokens_is_cut_and_not_emitted() {
    let _mlx = common::mlx_lock();
    let model = smollm2();
    let mut streamed = String::new();
    // "Paris" ends the answer; "of Fr" spans the tokens " of" and " France".
    let g = generate(&model, &request(france_prompt(&model), 40, &["of Fr", "zzz"]), |t| streamed.push_str(t)).unwrap();
    assert_eq!(g.finish, FinishReason::Stop);
    assert_eq!(g.text, "The capital ");
    assert_eq!(streamed, "The capital ");
}

#[test]
fn max_tokens_gives_length() {
    let _mlx = common::mlx_lock();
    let model = smollm2();
    let g = generate(&model, &request(france_prompt(&model), 3, &[]), |_| {}).unwrap();
    assert_eq!(g.finish, FinishReason::Length);
    assert_eq!(g.tokens.len(), 3);
    assert_eq!(g.text, "The capital of");
}

#[test]
fn bad_requests_are_errors() {
    let _mlx = common::mlx_lock();
    let model = smollm2();
    let limit = model.transformer.config.max_position_embeddings;
    assert!(matches!(generate(&model, &request(vec![], 4, &[]), |_| {}), Err(GenerateError::EmptyPrompt)));
    let long = vec![100u32; limit + 5];
    match generate(&model, &request(long, 4, &[]), |_| {}) {
        Err(GenerateError::PromptTooLong { tokens, limit: l }) => assert_eq!((tokens, l), (limit + 5, limit)),
        other => panic!("expected PromptTooLong, got {:?}", other.map(|g| g.text)),
    }
    assert!(matches!(
        generate(&model, &request(vec![1, 999_999], 4, &[]), |_| {}),
        Err(GenerateError::BadToken(999_999))
    ));
    let mut bad = request(vec![1, 2, 3], 4, &[]);
    bad.params.temperature = -1.0;
    assert!(matches!(generate(&model, &bad, |_| {}), Err(GenerateError::InvalidParams(_))));
}
