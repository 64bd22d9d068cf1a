//! `fastmlx serve --cluster hosts.json --rank N`: one model served across the machines of a
//! cluster, split into pipeline stages by each machine's room. Every machine runs the same
//! command with its own rank: rank 0 runs the HTTP server and the engine on the first stage
//! (batching, scheduling, sampling, grammars); the others hold the later layers and follow the
//! engine's steps (`cluster::stage_server`) until rank 0 unloads the model or stops.

use std::path::PathBuf;

use anyhow::Context;

use super::cluster_cmd::Joined;
use super::generate_cluster::Parallel;
use super::serve_cmd::{serve_loaded, ServeArgs};
use crate::cluster::pipeline::Pipeline;
use crate::engine::remote::{ClusterView, RemoteLayers};
use crate::mlx::Backend;
use crate::model::ModelError;

pub fn run(args: ServeArgs, path: PathBuf, hosts_path: PathBuf) -> anyhow::Result<()> {
    if args.cluster.parallel == Parallel::Tensor {
        anyhow::bail!(
            "serve --cluster splits the model into pipeline stages only for now (`--parallel tensor` is in \
             `fastmlx generate --cluster`)"
        );
    }
    if args.draft_model.is_some() {
        anyhow::bail!("--draft-model is not served across a cluster yet (n-gram drafting is)");
    }
    let kv_format = args.kv.format()?;
    // What changes the numbers a rank computes must be the same on every rank.
    let settings = format!(
        "parallel=pipeline weights={:?} kv_bits={} kv_group_size={} kv_start={}",
        args.weights, args.kv.kv_bits, args.kv.kv_group_size, args.kv.kv_start
    );
    let room = args.residency_config()?.memory_budget;
    let Joined { group, rooms, rank, watchdog, hosts, links } =
        super::cluster_cmd::join(&args.cluster, &hosts_path, &path, &settings, room)?;
    let options = args.weights.load_options();

    if rank != 0 {
        let backend = Backend::init();
        let loaded = crate::cluster::load_stage(&path, &backend, &options, &rooms, rank);
        let (model, held, _) = crate::cluster::agree_on_load(&group, &watchdog, loaded)
            .with_context(|| format!("loading {}", path.display()))?;
        model.transformer.config.check_kv_format(kv_format).map_err(anyhow::Error::msg)?;
        eprintln!("rank {rank} of {}: {} {held}, serving rank 0's engine", group.size(), model.name);
        // Its own prefix cache of its layers, keyed as rank 0's: a hit there is a hit here.
        let engine = args.residency_config()?.engine;
        let context = engine.context_length(model.transformer.config.max_position_embeddings);
        let prefix = crate::engine::kv::prefix_cache_for(&model, context, &engine, engine.prefix_cache_bytes);
        let hidden = model.transformer.config.hidden_size;
        let mut pipeline = Pipeline::new(group, watchdog, hidden);
        return pipeline.serve_stage(&model.transformer, kv_format, prefix).map_err(anyhow::Error::msg);
    }

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let models = args.residency()?;
        let size = group.size();
        let distributed = args.cluster.backend.clone();
        let load = move |path: PathBuf, options| -> Result<(_, Box<dyn RemoteLayers>), ModelError> {
            let backend = Backend::init();
            let loaded = crate::cluster::load_stage(&path, &backend, &options, &rooms, 0);
            let (model, held, plan) = crate::cluster::agree_on_load(&group, &watchdog, loaded)?;
            eprintln!("rank 0 of {size}: {} {held}", model.name);
            let hidden = model.transformer.config.hidden_size;
            let view = ClusterView::new(crate::cluster::status_of(&distributed, &hosts, &rooms, &plan, &links));
            let pipeline = Pipeline::new(group, watchdog.clone(), hidden).with_view(view);
            // Rank 0 stays up when a rank is lost: its requests end with the reason, the
            // server says it, and the wait that never returns is left behind.
            let health = pipeline.health();
            watchdog.on_expiry(move |error| health.fail(format!("the cluster lost a rank: {error}")));
            Ok((model, Box::new(pipeline)))
        };
        let first = models
            .load_split(&path.to_string_lossy(), load)
            .await
            .with_context(|| format!("loading {} across the cluster", path.display()))?;
        serve_loaded(args, models, first).await
    })
}
