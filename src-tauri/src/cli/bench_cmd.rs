//! `fastmlx bench`: single-stream prompt and decode speed, the figures `scripts/bench.sh`
//! puts next to mlx-lm's on the same model and machine.

use std::path::PathBuf;

use clap::Args;

use crate::generate::{generate, GenerateRequest};
use crate::mlx::Backend;
use crate::model::load_model;
use crate::sampling::SamplingParams;

#[derive(Args)]
pub struct BenchArgs {
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
}

/// Prompt ids the Python side (scripts/reference/bench_mlx_lm.py) builds the same way.
pub fn bench_prompt(n: usize) -> Vec<u32> {
    (0..n).map(|i| 1000 + (i as u32 * 7919) % 30000).collect()
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let backend = Backend::init();
    let path = super::resolve_model_path(args.model)?;
    let model = load_model(&path, &backend)?;
    let request = GenerateRequest {
        prompt_ids: bench_prompt(args.prompt_tokens),
        params: SamplingParams::greedy(),
        max_tokens: args.gen_tokens,
        stop: vec![],
        ignore_eos: true,
    };
    generate(&model, &request, |_| {})?; // warm-up
    let mut prompt_tps = Vec::new();
    let mut decode_tps = Vec::new();
    let mut peak = 0;
    for _ in 0..args.runs.max(1) {
        let g = generate(&model, &request, |_| {})?;
        prompt_tps.push(g.stats.prompt_tokens_per_sec());
        decode_tps.push(g.stats.generation_tokens_per_sec());
        peak = peak.max(g.stats.peak_memory);
    }
    println!(
        "fastmlx  {:<40} prompt {:>5} tok: {:>8.1} tok/s | decode {:>4} tok: {:>7.1} tok/s | peak {:.0} MB | {}",
        model.name,
        args.prompt_tokens,
        median(&mut prompt_tps),
        args.gen_tokens,
        median(&mut decode_tps),
        peak as f64 / 1e6,
        backend.name(),
    );
    Ok(())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
