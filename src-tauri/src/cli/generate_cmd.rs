//! `fastmlx generate` and `fastmlx make-test-model`.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use serde_json::json;

use crate::fixtures::synthetic_decoder_encoder::{write_tiny_decoder_encoder, DECODER_ENCODERS};
use crate::fixtures::{scripted, synthetic};
use crate::generate::{generate, GenerateRequest, Generation};
use crate::mlx::{self, Backend};
use crate::model::{load_model_with, Arch, KvFormat, LoadedModel};
use crate::sampling::SamplingParams;
use crate::tokenizer::chat_template::RenderRequest;

#[derive(Args)]
pub struct GenerateArgs {
    /// How quantized weights are held in memory.
    #[arg(long, env = "FASTMLX_WEIGHTS", value_enum, default_value_t = super::WeightsArg::Auto)]
    pub(super) weights: super::WeightsArg,
    /// A model folder (Hugging Face / MLX layout) or a .gguf file [default: SmolLM2-135M-Instruct]
    #[arg(long, short)]
    pub(super) model: Option<PathBuf>,
    /// The prompt text.
    #[arg(long, short, default_value = "Write a short poem about the sea.")]
    prompt: String,
    /// Send the prompt as a user message through the model's chat template.
    #[arg(long)]
    chat: bool,
    /// A system message (implies --chat).
    #[arg(long)]
    system: Option<String>,
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    temp: f32,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    #[arg(long)]
    seed: Option<u64>,
    /// Stop when this text appears (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Do not stop at the end-of-sequence token.
    #[arg(long)]
    ignore_eos: bool,
    #[command(flatten)]
    pub(super) kv: super::KvArgs,
    #[command(flatten)]
    pub(super) cluster: super::generate_cluster::ClusterArgs,
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    if let Some(hosts) = args.cluster.hostfile() {
        return super::generate_cluster::run(args, hosts);
    }
    let kv_format = args.kv.format()?;
    let backend = Backend::init();
    let path = super::resolve_model_path(args.model.clone())?;
    let load_started = Instant::now();
    let model = load_model_with(&path, &backend, &args.weights.load_options())
        .with_context(|| format!("loading {}", path.display()))?;
    model.transformer.config.check_kv_format(kv_format).map_err(anyhow::Error::msg)?;
    eprintln!(
        "loaded {} ({:?}, {} layers) on {} in {:.2}s",
        model.name,
        model.transformer.config.arch,
        model.transformer.config.num_layers,
        backend.name(),
        load_started.elapsed().as_secs_f64()
    );
    let request = args.request(&model, kv_format)?;
    let generation = generate(&model, &request, print_text())?;
    print_stats(&generation);
    Ok(())
}

impl GenerateArgs {
    /// What this generation asks for, in words (tensor-parallel ranks must all run the same).
    pub(super) fn request_text(&self) -> String {
        format!(
            "{:?}",
            (
                (&self.prompt, self.chat, &self.system, self.max_tokens, &self.stop, self.ignore_eos),
                (self.temp, self.top_p, self.top_k, self.min_p, self.repetition_penalty, self.seed),
            )
        )
    }

    /// The request these flags ask of `model`: the prompt tokenized (through its chat
    /// template with `--chat`) and the sampling settings.
    pub(super) fn request(&self, model: &LoadedModel, kv_format: KvFormat) -> anyhow::Result<GenerateRequest> {
        let chat = self.chat || self.system.is_some();
        let prompt_ids = if chat {
            let template = model.chat_template.as_ref().context("this model has no chat template; drop --chat")?;
            let mut messages = Vec::new();
            if let Some(system) = &self.system {
                messages.push(json!({"role": "system", "content": system}));
            }
            messages.push(json!({"role": "user", "content": self.prompt}));
            let text = template.render(&RenderRequest {
                messages: &messages,
                add_generation_prompt: true,
                ..Default::default()
            })?;
            model.tokenizer.encode(&text, false, true)?
        } else {
            model.tokenizer.encode(&self.prompt, true, true)?
        };
        Ok(GenerateRequest {
            prompt_ids,
            params: SamplingParams {
                temperature: self.temp,
                top_p: self.top_p,
                top_k: self.top_k,
                min_p: self.min_p,
                repetition_penalty: self.repetition_penalty,
                seed: self.seed,
                ..Default::default()
            },
            max_tokens: self.max_tokens,
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            kv_format,
        })
    }
}

/// Writes each piece of text to stdout as it comes.
pub(super) fn print_text() -> impl FnMut(&str) {
    let mut stdout = std::io::stdout();
    move |text: &str| {
        let _ = stdout.write_all(text.as_bytes());
        let _ = stdout.flush();
    }
}

/// The speeds and memory of a generation, on stderr (after its text on stdout).
pub(super) fn print_stats(generation: &Generation) {
    println!();
    let s = &generation.stats;
    eprintln!("==========");
    eprintln!("Prompt: {} tokens, {:.1} tokens-per-sec", s.prompt_tokens, s.prompt_tokens_per_sec());
    eprintln!(
        "Generation: {} tokens, {:.1} tokens-per-sec ({:?})",
        s.generated_tokens,
        s.generation_tokens_per_sec(),
        generation.finish
    );
    eprintln!(
        "Peak memory: {:.1} MB (MLX active now {:.1} MB)",
        s.peak_memory as f64 / 1e6,
        mlx::memory_stats().active as f64 / 1e6
    );
}

#[derive(Args)]
pub struct MakeTestModelArgs {
    /// A `model_type`: llama, mistral, qwen2, qwen3, phi3, qwen3_moe, qwen2_moe, mixtral,
    /// gemma3_text, gpt_oss, ministral3, gemma4_text
    #[arg(long, required_unless_present_any = ["scripted", "encoder"])]
    arch: Option<String>,
    /// Instead: a tiny encoder (embedding model or reranker) in the sentence-transformers layout:
    /// bert-mean, bert-cls, bert-max-dense, bert-multi, bert-lasttoken, xlmr-mean, modernbert-mean,
    /// nomic-bert-mean, bert-reranker, xlmr-reranker, modernbert-reranker; decoders as encoders:
    /// qwen3-embedding, gemma3-embedding, qwen3-reranker (its folder's name must say "reranker").
    #[arg(long, conflicts_with_all = ["arch", "scripted"])]
    encoder: Option<String>,
    /// Output folder.
    out: PathBuf,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Quantize the linear layers to this many bits (MLX affine, group size 64).
    #[arg(long)]
    bits: Option<i32>,
    /// MLX quantization mode with --bits: affine (group size 64), mxfp4 / mxfp8 (group 32), nvfp4 (16).
    #[arg(long, default_value = "affine")]
    mode: String,
    /// Write each expert's matrices apart, as Hugging Face checkpoints do (MoE models).
    #[arg(long)]
    per_expert: bool,
    /// Wrap the text model in its multimodal config (`gemma3` / `gemma4` / `mistral3`).
    #[arg(long)]
    wrapped: bool,
    /// The family's mixture-of-experts variant (gemma4_text).
    #[arg(long)]
    moe: bool,
    /// With a multi-token-prediction head (qwen3_5, qwen3_next).
    #[arg(long)]
    mtp: bool,
    /// Instead: a model that writes one tool call in this format (harmony, qwen-xml, qwen3.5,
    /// pythonic, gemma4, mistral), with --chat-template the family's template (tests of what clients
    /// receive); or `hermes`: --call, then --answer once the tool's result is in (agent tests).
    #[arg(long, requires = "chat_template")]
    scripted: Option<String>,
    #[arg(long)]
    chat_template: Option<PathBuf>,
    /// With `--scripted hermes`: the call, as compact JSON `{"name":...,"arguments":{...}}`.
    #[arg(long, requires = "answer")]
    call: Option<String>,
    /// With `--scripted hermes`: the answer after the tool's result (one word of printable ASCII).
    #[arg(long, requires = "call")]
    answer: Option<String>,
    /// The scripted model's tokenizer: this `tokenizer.json` (byte-level BPE) with the script's
    /// pieces added (default: a tiny byte-level one).
    #[arg(long, requires = "scripted")]
    tokenizer: Option<PathBuf>,
}

pub fn make_test_model(args: MakeTestModelArgs) -> anyhow::Result<()> {
    Backend::init();
    if args.scripted.as_deref() != Some("hermes") && (args.call.is_some() || args.answer.is_some()) {
        anyhow::bail!("--call and --answer go with --scripted hermes");
    }
    if let (Some(format), Some(template)) = (&args.scripted, &args.chat_template) {
        let source = std::fs::read_to_string(template).with_context(|| format!("reading {}", template.display()))?;
        let mut script = match format.as_str() {
            "harmony" => scripted::harmony_tool_call(&source),
            "qwen-xml" => scripted::qwen_xml_tool_call(&source),
            "qwen3.5" => scripted::qwen3_5_tool_call(&source),
            "pythonic" => scripted::pythonic_tool_call(&source),
            "gemma4" => scripted::gemma4_tool_call(&source),
            "mistral" => scripted::mistral_tool_call(&source),
            "glm" => scripted::glm_tool_call(&source),
            "kimi" => scripted::kimi_tool_call(&source),
            "nemotron" => scripted::nemotron_tool_call(&source),
            "minimax" => scripted::minimax_tool_call(&source),
            "deepseek" => scripted::deepseek_tool_call(&source),
            "hermes" => {
                let (Some(call), Some(answer)) = (&args.call, &args.answer) else {
                    anyhow::bail!("--scripted hermes needs --call and --answer");
                };
                scripted::hermes_round_trip(&source, call, answer)
            }
            other => {
                anyhow::bail!(
                    "unknown scripted format {other:?} (harmony, qwen-xml, qwen3.5, pythonic, gemma4, mistral, glm, kimi, nemotron, minimax, deepseek, hermes)"
                )
            }
        };
        if let Some(path) = &args.tokenizer {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            script.tokenizer =
                Some(serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?);
        }
        scripted::write_scripted_model(&args.out, &script)?;
        eprintln!("wrote a scripted {format} model to {}", args.out.display());
        return Ok(());
    }
    if let Some(name) = args.encoder.as_deref().filter(|n| DECODER_ENCODERS.contains(n)) {
        write_tiny_decoder_encoder(&args.out, name, args.seed)?;
        eprintln!("wrote a tiny {name} to {}", args.out.display());
        return Ok(());
    }
    if let Some(name) = &args.encoder {
        let variant = crate::fixtures::synthetic_encoder::encoder_variant(name)
            .with_context(|| format!("unknown tiny encoder {name:?}"))?;
        crate::fixtures::synthetic_encoder::write_tiny_encoder(&args.out, &variant, args.seed)?;
        eprintln!("wrote a tiny {name} encoder to {}", args.out.display());
        return Ok(());
    }
    let name = args.arch.as_deref().context("--arch is required")?;
    let arch = Arch::from_model_type(name).with_context(|| format!("unknown architecture {name:?}"))?;
    if args.mtp && !matches!(arch, Arch::Qwen35 | Arch::Qwen3Next) {
        anyhow::bail!("--mtp goes with qwen3_5 or qwen3_next (the families whose checkpoints ship the head)");
    }
    let options = synthetic::TinyOptions {
        quant: args.bits.map(|bits| synthetic::quant_spec(&args.mode, bits)).transpose().map_err(anyhow::Error::msg)?,
        per_expert: args.per_expert,
        wrapped: args.wrapped,
        moe: args.moe,
        mtp: args.mtp,
    };
    synthetic::write_tiny_model_with(&args.out, arch, args.seed, &options)?;
    eprintln!("wrote a tiny {} model to {}", arch.model_type(), args.out.display());
    Ok(())
}
