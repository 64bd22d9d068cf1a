//! `fastmlx inspect MODEL`: what a model is and what it serves on this machine, without loading
//! it: family, size, quantization, the weights in memory, the keys and values a token takes, and
//! the context each of a few requests gets at once under the memory ceiling (the planner the
//! server enforces at load, the same figures as the Models page).

use std::path::PathBuf;

use crate::engine::memory::serving_plan;
use crate::store::{human_bytes, Catalog, StorePaths};

#[derive(clap::Args)]
pub struct InspectArgs {
    /// A model id (as `fastmlx ls` lists it) or a path to a folder or a .gguf file; default: the
    /// default model.
    model: Option<String>,
    /// The memory ceiling to plan for (as `serve --memory-limit`: bytes, "24GB", or "70%").
    #[arg(long, env = "FASTMLX_MEMORY_LIMIT")]
    memory_limit: Option<String>,
    /// The engine's largest batch (as `serve --max-batch`).
    #[arg(long, default_value_t = crate::engine::EngineConfig::default().max_batch)]
    max_batch: usize,
    /// How quantized weights are held in memory (as `serve --weights`).
    #[arg(long, value_enum, default_value_t = super::WeightsArg::Auto)]
    weights: super::WeightsArg,
    /// Print the summary and the plans as JSON.
    #[arg(long)]
    json: bool,
}

/// Requests at once the table shows.
const ROWS: [usize; 4] = [1, 4, 8, 16];

pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    let model = match &args.model {
        Some(id_or_path) => Catalog::new(StorePaths::from_env()).find_or_add_path(id_or_path)?,
        None => Catalog::at_path(&super::resolve_model_path(None::<PathBuf>)?),
    };
    let machine = crate::mlx::machine_memory_bytes();
    let ceiling = match &args.memory_limit {
        Some(limit) => {
            crate::mlx::parse_memory_size(limit, machine).map_err(|e| anyhow::anyhow!("--memory-limit: {e}"))?
        }
        None => crate::mlx::default_ceiling(),
    };
    let summary = &model.summary;
    if let Some(reason) = &summary.unloadable_reason {
        anyhow::bail!("{} cannot be loaded by this build: {reason}", model.id);
    }
    let config = crate::model::read_config(&model.path)?;
    let options = args.weights.load_options();
    let weights = crate::store::estimated_weights_bytes(summary, &options);
    let gpu = crate::mlx::gpu_available();
    let act_bytes = if gpu { 2 } else { 4 };
    let plans: Vec<_> = ROWS
        .iter()
        .map(|&rows| serving_plan(&config, weights, ceiling, act_bytes, gpu, rows, args.max_batch.max(rows)))
        .collect();
    if args.json {
        let json = serde_json::json!({"id": model.id, "path": model.path, "summary": summary, "plans": plans});
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    println!("model         {}", model.id);
    println!("path          {}", model.path.display());
    println!("family        {}", or_dash(summary.architecture.clone()));
    println!("parameters    {}", or_dash(summary.parameters.map(|p| format!("{:.2} B", p as f64 / 1e9))));
    println!("quantization  {}", or_dash(summary.quantization.clone()));
    println!("layers        {} ({} keep keys and values)", config.num_layers, config.kv_cache_layers());
    println!("context       {} tokens (the model's own)", config.max_position_embeddings);
    println!();
    let first = &plans[0];
    let kv_1k = first.kv_bytes_per_token * 1000;
    println!(
        "on this machine ({} of memory, {}; ceiling {}{})",
        human_bytes(machine),
        if gpu { "Metal" } else { "MLX on the CPU" },
        human_bytes(ceiling),
        if args.memory_limit.is_some() { ", from --memory-limit" } else { ", the default" }
    );
    println!("weights       {} in memory", human_bytes(weights));
    println!("KV cache      {} per 1k tokens of context", human_bytes(kv_1k));
    println!();
    println!(
        "{:>9}  {:>18}  {:>10}  {:<8}  {:>14}  {:>14}",
        "REQUESTS", "CONTEXT EACH", "KV BUDGET", "FIT", "WITH 8-BIT KV", "WITH 4-BIT KV"
    );
    let tokens = |t: Option<usize>| t.map_or("-".to_string(), |t| format!("{t} tokens"));
    for plan in &plans {
        println!(
            "{:>9}  {:>18}  {:>10}  {:<8}  {:>14}  {:>14}",
            plan.rows,
            format!("{} tokens", plan.context_tokens),
            human_bytes(plan.kv_budget_bytes),
            plan.fit.as_str(),
            tokens(plan.context_tokens_kv8),
            tokens(plan.context_tokens_kv4)
        );
    }
    let four = &plans[1];
    println!();
    if four.context_tokens == 0 {
        println!("It does not fit under this ceiling: the weights and the engine's working memory alone exceed it.");
    } else {
        println!(
            "On this machine this model serves {} tokens of context to {} requests at once.",
            four.context_tokens, four.rows
        );
    }
    Ok(())
}
