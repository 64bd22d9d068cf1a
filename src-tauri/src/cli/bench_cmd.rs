//! `fastmlx bench`: single-stream speed (`generate`, the figures `scripts/bench.sh` puts next
//! to mlx-lm's) and the batching engine under concurrent load (`--concurrency 1,4,8,16,32`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;

use crate::engine::{EngineConfig, EngineHandle, Event, Request};
use crate::generate::{generate, GenerateRequest};
use crate::mlx::{self, Backend};
use crate::model::load_model_with;
use crate::sampling::SamplingParams;

#[derive(Args)]
pub struct BenchArgs {
    /// How quantized weights are held in memory.
    #[arg(long, env = "FASTMLX_WEIGHTS", value_enum, default_value_t = super::WeightsArg::Auto)]
    weights: super::WeightsArg,
    /// A model folder or .gguf file [default: SmolLM2-135M-Instruct]
    #[arg(long, short)]
    model: Option<PathBuf>,
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Timed runs after one warm-up; the median is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Drive the batching engine with this many concurrent clients (comma-separated levels)
    /// instead of timing a single stream.
    #[arg(long, value_delimiter = ',')]
    concurrency: Vec<usize>,
    /// With --concurrency: requests each client sends, one after the other.
    #[arg(long, default_value_t = 2)]
    requests_per_client: usize,
    /// With --concurrency: every answer must be JSON valid against this JSON Schema (a file).
    #[arg(long)]
    schema: Option<PathBuf>,
    #[command(flatten)]
    kv: super::KvArgs,
    /// Single stream: let the model run past its own context window, to this many tokens (a
    /// benchmark's numbers only: SmolLM2 was trained on 8192).
    #[arg(long)]
    context: Option<usize>,
}

/// Prompt ids the Python side (scripts/reference/bench_mlx_lm.py) builds the same way;
/// `salt` makes concurrent prompts differ.
pub fn bench_prompt(n: usize, salt: usize) -> Vec<u32> {
    (0..n).map(|i| 1000 + ((i + salt * 7) as u32 * 7919) % 30000).collect()
}

/// The longest prompt a single-stream warm-up runs.
const WARM_UP_TOKENS: usize = 512;

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.concurrency.is_empty() {
        single_stream(&args)
    } else {
        concurrent(&args)
    }
}

fn single_stream(args: &BenchArgs) -> anyhow::Result<()> {
    let backend = Backend::init();
    let path = super::resolve_model_path(args.model.clone())?;
    let mut model = load_model_with(&path, &backend, &args.weights.load_options())?;
    if let Some(context) = args.context {
        model.transformer.config.max_position_embeddings = context;
    }
    let kv_format = args.kv.format()?;
    model.transformer.config.check_kv_format(kv_format).map_err(anyhow::Error::msg)?;
    let request = GenerateRequest {
        prompt_ids: bench_prompt(args.prompt_tokens, 0),
        params: SamplingParams::greedy(),
        max_tokens: args.gen_tokens,
        stop: vec![],
        ignore_eos: true,
        kv_format,
    };
    // Warm-up: kernels and buffers, on at most 512 prompt tokens (a 16k prefill would double a
    // long benchmark's time for nothing; mlx-lm's side warms up on 256).
    let warm_up =
        GenerateRequest { prompt_ids: bench_prompt(args.prompt_tokens.min(WARM_UP_TOKENS), 0), ..request.clone() };
    generate(&model, &warm_up, |_| {})?;
    let mut prompt_tps = Vec::new();
    let mut decode_tps = Vec::new();
    let mut ttft = Vec::new();
    let (mut peak, mut kv_bytes) = (0, 0);
    for _ in 0..args.runs.max(1) {
        let g = generate(&model, &request, |_| {})?;
        prompt_tps.push(g.stats.prompt_tokens_per_sec());
        decode_tps.push(g.stats.generation_tokens_per_sec());
        ttft.push(g.stats.prefill_time.as_secs_f64() * 1e3);
        peak = peak.max(g.stats.peak_memory);
        kv_bytes = g.stats.kv_bytes;
    }
    let kv = match kv_format.quant {
        Some(q) => format!("kv {}-bit g{} from {}", q.bits, q.group_size, kv_format.start),
        None => "kv full".to_string(),
    };
    println!(
        "fastmlx  {:<40} prompt {:>5} tok: {:>8.1} tok/s, TTFT {:>7.0} ms | decode {:>4} tok: {:>7.1} tok/s | KV {:.1} MB ({kv}) | peak {:.0} MB | {}",
        model.name,
        args.prompt_tokens,
        percentile(&mut prompt_tps, 50.0),
        percentile(&mut ttft, 50.0),
        args.gen_tokens,
        percentile(&mut decode_tps, 50.0),
        kv_bytes as f64 / 1e6,
        peak as f64 / 1e6,
        backend.name(),
    );
    Ok(())
}

/// What one request saw.
struct Trace {
    ttft: Duration,
    gaps: Vec<Duration>,
    tokens: usize,
}

fn concurrent(args: &BenchArgs) -> anyhow::Result<()> {
    let path = super::resolve_model_path(args.model.clone())?;
    let grammar = match &args.schema {
        Some(file) => {
            let schema: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(file)?)?;
            Some(std::sync::Arc::new(
                crate::constrain::Grammar::from_schema(&schema).map_err(|e| anyhow::anyhow!("{e}"))?,
            ))
        }
        None => None,
    };
    let max_batch = args.concurrency.iter().copied().max().unwrap_or(1).max(1);
    let options = args.weights.load_options();
    let engine = EngineHandle::start(
        EngineConfig { max_batch, kv_format: args.kv.format()?, ..Default::default() },
        move || load_model_with(&path, &Backend::init(), &options),
    )?;
    println!(
        "engine   {} | prompt {} tok, {} generated tok per request, {} requests per client",
        engine.model_info().name,
        args.prompt_tokens,
        args.gen_tokens,
        args.requests_per_client
    );
    run_level(&engine, args, &grammar, 1, 1); // warm-up
    for &clients in &args.concurrency {
        mlx::reset_peak_memory();
        let started = Instant::now();
        let traces = run_level(&engine, args, &grammar, clients, args.requests_per_client);
        let wall = started.elapsed().as_secs_f64();
        let peak = engine.snapshot().mlx_peak_bytes;
        let tokens: usize = traces.iter().map(|t| t.tokens).sum();
        let mut ttft: Vec<f64> = traces.iter().map(|t| t.ttft.as_secs_f64() * 1e3).collect();
        let mut itl: Vec<f64> = traces.iter().flat_map(|t| t.gaps.iter().map(|g| g.as_secs_f64() * 1e3)).collect();
        println!(
            "concurrency {clients:>3}: {:>7.1} output tok/s | TTFT p50 {:>7.0} ms p95 {:>7.0} ms | ITL p50 {:>6.1} ms p95 {:>6.1} ms | peak {:.0} MB",
            tokens as f64 / wall,
            percentile(&mut ttft, 50.0),
            percentile(&mut ttft, 95.0),
            percentile(&mut itl, 50.0),
            percentile(&mut itl, 95.0),
            peak as f64 / 1e6
        );
    }
    engine.shutdown();
    Ok(())
}

/// `clients` threads each send `per_client` requests one after the other.
fn run_level(
    engine: &EngineHandle,
    args: &BenchArgs,
    grammar: &Option<std::sync::Arc<crate::constrain::Grammar>>,
    clients: usize,
    per_client: usize,
) -> Vec<Trace> {
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let engine = engine.clone();
            let grammar = grammar.clone();
            let (prompt_tokens, gen_tokens) = (args.prompt_tokens, args.gen_tokens);
            std::thread::spawn(move || {
                (0..per_client)
                    .map(|r| {
                        let mut request = Request::new(bench_prompt(prompt_tokens, c * 1000 + r), gen_tokens);
                        request.ignore_eos = true;
                        request.grammar = grammar.clone();
                        let started = Instant::now();
                        let mut stream = engine.submit(request).expect("bench requests fit");
                        let mut last = None;
                        let mut trace = Trace { ttft: Duration::ZERO, gaps: Vec::new(), tokens: 0 };
                        while let Some(event) = stream.blocking_recv() {
                            if let Event::Delta { .. } = event {
                                let now = Instant::now();
                                match last {
                                    None => trace.ttft = now - started,
                                    Some(prev) => trace.gaps.push(now - prev),
                                }
                                last = Some(now);
                                trace.tokens += 1;
                            }
                        }
                        trace
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    threads.into_iter().flat_map(|t| t.join().expect("bench client")).collect()
}

pub(super) fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * (values.len() - 1) as f64).round() as usize;
    values[rank.min(values.len() - 1)]
}
