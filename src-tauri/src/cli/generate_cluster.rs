//! `fastmlx generate --cluster hosts.json --rank N`: one generation with the model split across
//! the machines of a cluster (every rank runs the same command with its own rank; rank 0 prints
//! the text), into pipeline stages (`--parallel pipeline`) or by heads and columns (`--parallel
//! tensor`). The ranks agree on the version, the model and the settings first; every wait on
//! another rank has a deadline (`--timeout`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;

use super::cluster_cmd::{rank_and_watchdog, Joined};
use super::generate_cmd::{print_stats, print_text, GenerateArgs};
use crate::cluster::pipeline::Pipeline;
use crate::cluster::sum_sampler::{StepKind, SumSampler};
use crate::cluster::watchdog::Watchdog;
pub use crate::cluster::Parallel;
use crate::generate::generate_with;
use crate::mlx::distributed::Group;
use crate::mlx::Backend;
use crate::model::{KvFormat, LoadedModel, ModelError};

#[derive(Args, Clone)]
pub struct ClusterArgs {
    /// Split the model across the machines of this host file (MLX's ring format
    /// `[["ip:port"], ...]` or mlx.launch's), each running this command with its `--rank`.
    #[arg(long, value_name = "HOSTFILE")]
    pub(super) cluster: Option<PathBuf>,
    /// This machine's place in the host file; default: `MLX_RANK`.
    #[arg(long, requires = "cluster")]
    pub(super) rank: Option<usize>,
    /// MLX's backend: `ring` (TCP, any network) or `jaccl` (RDMA over Thunderbolt 5).
    #[arg(long, default_value = "ring", requires = "cluster")]
    pub(super) backend: String,
    /// Seconds any wait on another rank may take (forming the cluster included) before this
    /// rank gives up with an error.
    #[arg(long, default_value_t = 120, requires = "cluster")]
    pub(super) timeout: u64,
    /// How the model is split: `pipeline` (consecutive layers per machine, the residual stream
    /// passed on) or `tensor` (every layer's heads and MLP columns shared out, partial outputs
    /// summed after each attention and MLP: for fast links).
    #[arg(long, value_enum, default_value_t = Parallel::Pipeline, requires = "cluster")]
    pub(super) parallel: Parallel,
}

impl ClusterArgs {
    pub fn hostfile(&self) -> Option<PathBuf> {
        self.cluster.clone()
    }
}

pub fn run(args: GenerateArgs, hosts_path: PathBuf) -> anyhow::Result<()> {
    let cluster = &args.cluster;
    let kv_format = args.kv.format()?;
    let backend = Backend::init();
    let path = super::resolve_model_path(args.model.clone())?;
    let path = super::cluster_model::local_or_pulled(&path, "this rank")?;
    // What changes the numbers every rank computes must be the same on every rank; tensor
    // parallel ranks each run the whole generation, so the request too.
    let mut settings = format!(
        "parallel={:?} weights={:?} kv_bits={} kv_group_size={} kv_start={}",
        cluster.parallel, args.weights, args.kv.kv_bits, args.kv.kv_group_size, args.kv.kv_start
    );
    if cluster.parallel == Parallel::Tensor {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(args.request_text().as_bytes());
        settings += &format!(" request={}", digest[..8].iter().map(|b| format!("{b:02x}")).collect::<String>());
    }
    let Joined { group, rooms, rank, watchdog, .. } = super::cluster_cmd::join(
        cluster,
        rank_and_watchdog(cluster)?,
        &crate::cluster::hostfile::HostFile::read(&hosts_path).map_err(anyhow::Error::msg)?,
        &crate::cluster::identity::NodeIdentity::of(&path, &settings).map_err(anyhow::Error::msg)?,
        crate::mlx::default_ceiling(),
    )?;

    let load_started = Instant::now();
    let options = args.weights.load_options();
    let loaded = crate::cluster::load_part(&path, &backend, &options, &rooms, &group, cluster.parallel);
    let (model, held, _) = crate::cluster::agree_on_load(&group, &watchdog, loaded, &[])
        .with_context(|| format!("loading {}", path.display()))?;
    model.transformer.config.check_kv_format(kv_format).map_err(anyhow::Error::msg)?;
    eprintln!(
        "rank {rank} of {}: {} {held} ({:.1} MB of weights, MLX holds {:.1} MB) on {} in {:.2}s",
        group.size(),
        model.name,
        model.weights_bytes as f64 / 1e6,
        crate::mlx::memory_stats().active as f64 / 1e6,
        backend.name(),
        load_started.elapsed().as_secs_f64()
    );
    if cluster.parallel == Parallel::Tensor {
        return generate_by_tensors(&args, &model, kv_format, (&group, rank, &watchdog));
    }

    let hidden = model.transformer.config.hidden_size;
    let mut pipeline = Pipeline::new(group.clone(), watchdog, hidden);
    if rank != 0 {
        return pipeline.serve_stage(&model.transformer, kv_format, None).map_err(anyhow::Error::msg);
    }
    let generation = args.request(&model, kv_format).and_then(|request| {
        let mut forward = |ids: &mlx_rs::Array, cache: &mut [crate::model::KvCache]| {
            pipeline.forward(&model.transformer, ids, cache).map_err(ModelError::Mlx)
        };
        Ok(generate_with(&model, &request, &mut forward, print_text())?)
    });
    // The workers return whatever became of the generation.
    let stopped = pipeline.stop();
    let generation = generation?;
    stopped.map_err(anyhow::Error::msg)?;
    print_stats(&generation);
    let p = &pipeline.stats;
    if p.steps > 0 {
        eprintln!(
            "Pipeline: {} ranks, {} steps, {:.0} bytes per token per hop, rank 0 waited {:.2} ms per step for the others ({:.2} ms per step in all)",
            group.size(),
            p.steps,
            p.bytes_per_hop as f64 / p.tokens.max(1) as f64,
            p.waited.as_secs_f64() * 1e3 / p.steps as f64,
            p.total.as_secs_f64() * 1e3 / p.steps as f64,
        );
    }
    Ok(())
}

/// By tensors every rank runs the whole generation (the sums give each the same logits, so the
/// same tokens); each step's sums are waited for under the deadline. Rank 0 times the sums apart
/// from its layers now and then as the server does, prompt steps and decode steps apart.
fn generate_by_tensors(
    args: &GenerateArgs,
    model: &LoadedModel,
    kv_format: KvFormat,
    (group, rank, watchdog): (&Group, usize, &Watchdog),
) -> anyhow::Result<()> {
    let request = args.request(model, kv_format)?;
    let mut sampler = model.transformer.sum_clock().filter(|_| rank == 0).map(SumSampler::new);
    let mut forward = |ids: &mlx_rs::Array, cache: &mut [crate::model::KvCache]| {
        let _w = watchdog.waiting("summing a step's outputs with the other ranks");
        let started = Instant::now();
        if let Some(s) = sampler.as_mut() {
            s.start(StepKind::of(ids.dim(1) as usize));
        }
        let hidden = model.transformer.forward_hidden(ids, cache).and_then(|h| {
            h.eval()?;
            Ok(h)
        });
        if let Some(s) = sampler.as_mut() {
            s.finish(started.elapsed(), hidden.is_ok());
        }
        hidden
    };
    let on_text: Box<dyn FnMut(&str)> = if rank == 0 { Box::new(print_text()) } else { Box::new(|_| {}) };
    let generation = generate_with(model, &request, &mut forward, on_text)?;
    if rank == 0 {
        print_stats(&generation);
    }
    if let Some(sampler) = sampler {
        let timed: Vec<String> = [(StepKind::Prompt, "prompt"), (StepKind::Decode, "decode")]
            .into_iter()
            .map(|(kind, name)| (sampler.timed(kind), name))
            .filter(|(t, _)| t.steps > 0)
            .map(|(t, name)| {
                let (sums, total) = t.per_step_ms();
                format!("{name} steps {sums:.2} ms of a {total:.2} ms timed step ({} timed)", t.steps)
            })
            .collect();
        eprintln!(
            "Sums: {} ranks, {} sums per step, in the sums: {}",
            group.size(),
            model.transformer.sums_per_step(),
            timed.join(", ")
        );
    }
    Ok(())
}
