//! `fastmlx serve --cluster hosts.json --rank N`: one model served across the machines of a
//! cluster, split into pipeline stages by each machine's room. Every machine runs the same
//! command with its own rank: rank 0 runs the HTTP server and the engine on the first stage
//! (batching, scheduling, sampling, grammars); the others hold the later layers and follow the
//! engine's steps (`cluster::stage_server`) until rank 0 unloads the model or stops.
//!
//! A cluster that loses a rank forms again by itself: rank 0 keeps its port and answers 503
//! with the reason while the cluster forms; each rank that lost the others (rank 0 once its
//! streams have ended) starts again in place (`rejoin`) and waits for the rest. A rank that
//! cannot be reached is waited for; a rank that disagrees (model, version, settings) is an
//! error that ends the process.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use super::cluster_cmd::{rank_and_watchdog, Joined};
use super::generate_cluster::{ClusterArgs, Parallel};
use super::rejoin;
use super::serve_cmd::{shutdown_signal, start_server, stop_server, ServeArgs};
use crate::cluster::hostfile::HostFile;
use crate::cluster::pipeline::Pipeline;
use crate::cluster::watchdog::Watchdog;
use crate::cluster::FormError;
use crate::engine::remote::{ClusterView, RemoteLayers};
use crate::mlx::Backend;
use crate::model::ModelError;
use crate::server::RunningServer;
use crate::store::Residency;

/// A pause before trying again to form a cluster a rank was missing from.
const RETRY_PAUSE: Duration = Duration::from_secs(1);
/// How long rank 0 lets its other models' requests finish before it starts again.
const DRAIN: Duration = Duration::from_secs(30);

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
    let hosts = HostFile::read(&hosts_path).map_err(anyhow::Error::msg)?;
    let (rank, watchdog) = rank_and_watchdog(&args.cluster)?;
    if rank != 0 {
        // A wait for the others past its deadline (rank 0 gone, or another rank) starts it again.
        watchdog.on_expiry(|error| rejoin::restart(&error));
        return serve_stage(args, &path, &hosts_path, (rank, watchdog));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(serve_first_stage(args, path, hosts_path, hosts, watchdog))
}

/// What changes the numbers a rank computes: the same on every rank.
fn settings(args: &ServeArgs) -> String {
    format!(
        "parallel=pipeline weights={:?} kv_bits={} kv_group_size={} kv_start={}",
        args.weights, args.kv.kv_bits, args.kv.kv_group_size, args.kv.kv_start
    )
}

/// What joining the cluster takes (a worker and rank 0 alike).
struct JoinAsk {
    cluster: ClusterArgs,
    hosts_path: PathBuf,
    model: PathBuf,
    settings: String,
    /// This rank's room for weights.
    room: u64,
}

impl JoinAsk {
    fn of(args: &ServeArgs, model: &Path, hosts_path: &Path) -> anyhow::Result<JoinAsk> {
        Ok(JoinAsk {
            cluster: args.cluster.clone(),
            hosts_path: hosts_path.to_path_buf(),
            model: model.to_path_buf(),
            settings: settings(args),
            room: args.residency_config()?.memory_budget,
        })
    }

    /// Joins the cluster; where a rank was missing, `Ok(Err(why))`: worth trying again.
    fn join(&self, rank_watchdog: (usize, Watchdog)) -> anyhow::Result<Result<Joined, String>> {
        let rank = rank_watchdog.0;
        let joined = super::cluster_cmd::join(
            &self.cluster,
            rank_watchdog,
            &self.hosts_path,
            &self.model,
            &self.settings,
            self.room,
        );
        match joined {
            Err(e) if matches!(e.downcast_ref::<FormError>(), Some(FormError::Absent(_))) => {
                Ok(Err(format!("rank {rank}: the cluster did not form: {e}")))
            }
            joined => joined.map(Ok),
        }
    }
}

/// A worker: its layers, on rank 0's steps, until rank 0 stops; it starts again when the
/// others are lost.
fn serve_stage(
    args: ServeArgs,
    path: &Path,
    hosts_path: &Path,
    rank_watchdog: (usize, Watchdog),
) -> anyhow::Result<()> {
    let kv_format = args.kv.format()?;
    let Joined { group, rooms, rank, watchdog, .. } = match JoinAsk::of(&args, path, hosts_path)?.join(rank_watchdog)? {
        Ok(joined) => joined,
        Err(why) => {
            std::thread::sleep(RETRY_PAUSE);
            rejoin::restart(&why)
        }
    };
    let backend = Backend::init();
    let loaded = load_checked(path, &backend, &args.weights.load_options(), &rooms, rank, kv_format);
    let (model, held, plan) = crate::cluster::agree_on_load(&group, &watchdog, loaded)
        .with_context(|| format!("loading {}", path.display()))?;
    eprintln!("rank {rank} of {}: {} {held}, serving rank 0's engine", group.size(), model.name);
    // Its room for keys and values bounds what rank 0 admits: this machine's memory is not
    // governed by an engine of its own.
    let residency = args.residency_config()?;
    let engine = residency.engine;
    let layers = plan[rank].layers.clone();
    let room =
        crate::engine::memory::stage_kv_capacity(&model.transformer, layers, &engine, residency.memory_budget as usize);
    eprintln!("rank {rank}: room for {room} tokens of keys and values");
    if let Err(e) = crate::cluster::gather_kv_capacity(&group, &watchdog, Some(room)) {
        rejoin::restart(&format!("rank {rank}: the cluster lost a rank: {e}"))
    }
    // Its own prefix cache of its layers, keyed as rank 0's: a hit there is a hit here.
    let context = engine.context_length(model.transformer.config.max_position_embeddings);
    let prefix = crate::engine::kv::prefix_cache_for(&model, context, &engine, engine.prefix_cache_bytes);
    let hidden = model.transformer.config.hidden_size;
    let mut pipeline = Pipeline::new(group, watchdog, hidden);
    match pipeline.serve_stage(&model.transformer, kv_format, prefix) {
        Ok(()) => Ok(()),
        Err(e) => rejoin::restart(&format!("rank {rank}: the cluster lost a rank: {e}")),
    }
}

/// This rank's stage of the model, its KV format checked before the ranks agree that all
/// loaded (so a format the model cannot hold fails every rank at once).
fn load_checked(
    path: &Path,
    backend: &Backend,
    options: &crate::model::LoadOptions,
    rooms: &[u64],
    rank: usize,
    kv_format: crate::model::KvFormat,
) -> Result<(crate::model::LoadedModel, String, Vec<crate::model::Stage>), ModelError> {
    let (model, held, plan) = crate::cluster::load_stage(path, backend, options, rooms, rank)?;
    model.transformer.config.check_kv_format(kv_format).map_err(ModelError::Invalid)?;
    Ok((model, held, plan))
}

/// Rank 0: the HTTP server at once (the model answered 503 with the reason while the cluster
/// forms), then the cluster, the model's first stage and the engine; after a lost rank, a
/// fresh start of this process to form the cluster again.
async fn serve_first_stage(
    args: ServeArgs,
    path: PathBuf,
    hosts_path: PathBuf,
    hosts: HostFile,
    watchdog: Watchdog,
) -> anyhow::Result<()> {
    let models = args.residency()?;
    let id = models.catalog().find_or_add_path(&path.to_string_lossy())?.id;
    let others: Vec<String> = hosts
        .ranks
        .iter()
        .enumerate()
        .skip(1)
        .map(|(rank, addresses)| format!("rank {rank} ({})", addresses.join(", ")))
        .collect();
    let waiting = match rejoin::restarted_after() {
        Some(why) => format!("{why}; waiting for every rank to join again: {}", others.join(", ")),
        None => format!("waiting for the cluster to form: {}", others.join(", ")),
    };
    models.await_split(&id, waiting);
    let server = start_server(&args, &models).await?;
    eprintln!("FastMLX at {}: {id} is served once the cluster has formed", server.url());

    // While the cluster forms, a wait past its deadline starts this process again.
    let (expired_tx, mut expired) = tokio::sync::mpsc::unbounded_channel();
    watchdog.on_expiry(move |error| {
        let _ = expired_tx.send(error);
    });
    let ask = JoinAsk::of(&args, &path, &hosts_path)?;
    let joining = tokio::task::spawn_blocking(move || ask.join((0, watchdog)));
    let joined = tokio::select! {
        joined = joining => joined??,
        Some(error) = expired.recv() => Err(error),
    };
    let Joined { group, rooms, watchdog, hosts, links, .. } = match joined {
        Ok(joined) => joined,
        Err(why) => {
            tokio::time::sleep(RETRY_PAUSE).await;
            start_again(&models, server, &id, why).await
        }
    };
    let size = group.size();
    let distributed = args.cluster.backend.clone();
    let kv_format = args.kv.format()?;
    let load = move |path: PathBuf, options| -> Result<(_, Box<dyn RemoteLayers>), ModelError> {
        let backend = Backend::init();
        let loaded = load_checked(&path, &backend, &options, &rooms, 0, kv_format);
        let (model, held, plan) = crate::cluster::agree_on_load(&group, &watchdog, loaded)?;
        eprintln!("rank 0 of {size}: {} {held}", model.name);
        let room = crate::cluster::gather_kv_capacity(&group, &watchdog, None).map_err(ModelError::Invalid)?;
        let hidden = model.transformer.config.hidden_size;
        let view = ClusterView::new(crate::cluster::status_of(&distributed, &hosts, &rooms, &plan, &links));
        let pipeline = Pipeline::new(group, watchdog.clone(), hidden).with_view(view).with_kv_capacity(room);
        // Rank 0 stays up when a rank is lost: its requests end with the reason, the
        // server says it, and the wait that never returns is left behind.
        let health = pipeline.health();
        watchdog.on_expiry(move |error| health.fail(format!("the cluster lost a rank: {error}")));
        Ok((model, Box::new(pipeline)))
    };
    // Until the engine takes over the link, a wait past the deadline still starts this again.
    let first = tokio::select! {
        first = models.load_split(&id, load) => first.with_context(|| format!("loading {id} across the cluster"))?,
        Some(error) = expired.recv() => start_again(&models, server, &id, error).await,
    };
    eprintln!("FastMLX serving {} at {}", first.id, server.url());
    let lost = first.engine.fault_watch();
    drop(first);
    tokio::select! {
        _ = shutdown_signal() => stop_server(models, server).await,
        fault = lost_rank(lost) => {
            // Its streams have their error events; the others' requests finish first (a
            // signal meanwhile still stops the server).
            tokio::select! {
                _ = shutdown_signal() => stop_server(models, server).await,
                () = drained(&models, &id) => start_again(&models, server, &id, fault).await,
            }
        }
    }
}

/// Rank 0 starts again in place to form the cluster again (`why` it must), its port open
/// throughout: meanwhile the model is answered 503 with the reason.
async fn start_again(models: &Residency, server: RunningServer, id: &str, why: String) -> ! {
    models.await_split(id, format!("{why}; starting again to form the cluster"));
    server.hand_over(Duration::from_secs(5)).await;
    rejoin::restart(&why)
}

/// Once the split model's cluster lost a rank: why.
async fn lost_rank(fault: Option<tokio::sync::watch::Receiver<Option<String>>>) -> String {
    let Some(mut fault) = fault else { return std::future::pending().await };
    let why = fault.wait_for(Option::is_some).await.map(|why| why.clone().unwrap_or_default());
    // Err: the engine is gone, the server is stopping.
    match why {
        Ok(why) => why,
        Err(_) => std::future::pending().await,
    }
}

/// Rank 0 about to start again: a moment for the lost model's error events to reach their
/// clients, and up to [`DRAIN`] for the other models' requests to finish.
async fn drained(models: &Residency, lost: &str) {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = std::time::Instant::now();
    while started.elapsed() < DRAIN && models.loaded().iter().any(|m| m.id != lost && m.running + m.queued > 0) {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
