//! `fastmlx serve --cluster hosts.json --rank N`: one model served across the machines of a
//! cluster, split into pipeline stages by each machine's room (or, `--parallel tensor`, each
//! layer's heads and columns shared out). Every machine runs the same command with its own
//! rank: rank 0 runs the HTTP server and the engine on the first stage (batching, scheduling,
//! sampling, grammars); the others hold the later layers (their shares) and follow the
//! engine's steps (`cluster::stage_server`) until rank 0 unloads the model or stops.
//!
//! Before MLX forms the cluster, the workers check in on rank 0's roster (`cluster::roster`),
//! which says when to form and with which machines. A cluster that loses a rank forms again by
//! itself: rank 0 keeps its port and answers 503 with the reason while the cluster forms; each
//! rank that lost the others (rank 0 once its streams have ended) starts again in place
//! (`rejoin`) and checks in. A machine gone for longer than `--drop-after` is left out of the
//! next cluster when the model fits on the others (split across them, or on rank 0 alone), and
//! joins again once it is back and the server is idle. A rank that disagrees (model, version,
//! settings) is an error that ends the process.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use super::cluster_cmd::{rank_and_watchdog, Joined};
use super::generate_cluster::{ClusterArgs, Parallel};
use super::rejoin;
use super::serve_cmd::{shutdown_signal, start_server, stop_server, ServeArgs};
use crate::cluster::hostfile::HostFile;
use crate::cluster::identity::NodeIdentity;
use crate::cluster::pipeline::Pipeline;
use crate::cluster::roster::{self, Decision, Membership, Roster};
use crate::cluster::watchdog::Watchdog;
use crate::cluster::{FormError, Shape, Unloaded};
use crate::engine::remote::{ClusterView, HeldBack, RemoteLayers};
use crate::mlx::Backend;
use crate::model::ModelError;
use crate::server::RunningServer;
use crate::store::Residency;

/// A pause before trying again to form a cluster a rank was missing from.
const RETRY_PAUSE: Duration = Duration::from_secs(1);
/// How long rank 0 lets its other models' requests finish before it starts again.
const DRAIN: Duration = Duration::from_secs(30);
/// How long the server is idle before a machine that is back is taken in again (forming again
/// reloads the model across the machines).
const REJOIN_IDLE: Duration = Duration::from_secs(5);

/// How a cluster copes with a machine that is gone.
#[derive(clap::Args, Clone, Debug)]
pub struct RosterArgs {
    /// Seconds a machine of the cluster may be gone before the others form without it, where
    /// the model fits on them (split across them again, or on rank 0 alone); 0: wait for it
    /// however long. It is taken in again once it is back and the server is idle.
    #[arg(long, default_value_t = 120, requires = "cluster")]
    drop_after: u64,
    /// The port of rank 0's roster, at its addresses in the host file: every machine checks in
    /// there before MLX forms the cluster (the same on every rank). Default: rank 0's port in
    /// the host file plus one, or the next one the file does not use.
    #[arg(long, requires = "cluster")]
    roster_port: Option<u16>,
    /// When a machine the cluster serves without is taken in again once it is back (rank 0
    /// starts again to reload the model across the machines, answering 503 meanwhile: minutes
    /// for a large model): `idle`, once the server has been idle 5 s; `asked`, only when asked
    /// (`POST /admin/cluster/take-back`, or the Server page).
    #[arg(long, value_enum, default_value_t = TakeBack::Idle, requires = "cluster")]
    take_back: TakeBack,
}

/// When a machine that is back is taken in again.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TakeBack {
    Idle,
    Asked,
}

impl TakeBack {
    fn as_str(self) -> &'static str {
        match self {
            TakeBack::Idle => "idle",
            TakeBack::Asked => "asked",
        }
    }
}

impl RosterArgs {
    fn port(&self, hosts: &HostFile) -> u16 {
        self.roster_port.unwrap_or_else(|| roster::default_port(hosts))
    }

    fn drop_after(&self) -> Option<Duration> {
        (self.drop_after > 0).then(|| Duration::from_secs(self.drop_after))
    }
}

/// Set by the app for the rank it runs: that process's id. The rank ends when the app does
/// (a crash included), rather than keep its port and memory with no one to stop it.
pub const EXIT_WITH_PARENT_VAR: &str = "FASTMLX_EXIT_WITH_PARENT";

pub fn run(args: ServeArgs, path: PathBuf, hosts_path: PathBuf) -> anyhow::Result<()> {
    exit_with_parent();
    let hosts = HostFile::read(&hosts_path).map_err(anyhow::Error::msg)?;
    let (place, watchdog) = rank_and_watchdog(&args.cluster)?;
    if place >= hosts.ranks.len() {
        anyhow::bail!("rank {place} is not in {} ({} ranks)", hosts_path.display(), hosts.ranks.len());
    }
    // A Hub repo absent here is pulled first; the given name stays the model's id on rank 0.
    let given = path.to_string_lossy().into_owned();
    let path = super::cluster_model::local_or_pulled(&path, &format!("rank {place}"))?;
    if place != 0 {
        // A wait for the others past its deadline (rank 0 gone, or another rank) starts it again.
        watchdog.on_expiry(|error| rejoin::restart(&error));
        let served = serve_stage(args, &path, &hosts, (place, watchdog));
        // Rank 0 is told why this machine leaves, so it is not taken for a machine lost.
        let why = match &served {
            Ok(()) => format!("rank {place} is done: rank 0 unloaded the model or stopped"),
            Err(e) => format!("rank {place} stopped: {e:#}"),
        };
        crate::cluster::presence::leave(&why);
        return served;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(serve_first_stage(args, (given, path), hosts, watchdog))
}

/// Where [`EXIT_WITH_PARENT_VAR`] names this process's parent, ends the process once its parent
/// is gone (it is then another's child: macOS has no signal for a parent's death).
fn exit_with_parent() {
    #[cfg(unix)]
    {
        let Some(parent) = std::env::var(EXIT_WITH_PARENT_VAR).ok().and_then(|p| p.parse::<i32>().ok()) else {
            return;
        };
        std::thread::spawn(move || loop {
            // SAFETY: getppid has no preconditions.
            if unsafe { libc::getppid() } != parent {
                eprintln!("the app that started this rank (process {parent}) is gone: stopping");
                crate::cluster::presence::leave("the app that started it is gone");
                std::process::exit(1);
            }
            std::thread::sleep(Duration::from_millis(500));
        });
    }
}

/// What changes the numbers a rank computes: the same on every rank.
fn settings(args: &ServeArgs) -> String {
    format!(
        "parallel={:?} weights={:?} kv_bits={} kv_group_size={} kv_start={}",
        args.cluster.parallel, args.weights, args.kv.kv_bits, args.kv.kv_group_size, args.kv.kv_start
    )
}

/// What joining the cluster takes (a worker and rank 0 alike).
struct JoinAsk {
    cluster: ClusterArgs,
    /// What this rank tells the others it serves (checked on the roster and again by MLX).
    identity: NodeIdentity,
    /// This rank's room for weights.
    room: u64,
}

impl JoinAsk {
    fn of(args: &ServeArgs, model: &Path) -> anyhow::Result<JoinAsk> {
        Ok(JoinAsk {
            cluster: args.cluster.clone(),
            identity: NodeIdentity::of(model, &settings(args)).map_err(anyhow::Error::msg)?,
            room: args.residency_config()?.memory_budget,
        })
    }

    /// Joins the cluster of `hosts` (its members' addresses) as the machine at `place` in the
    /// host file; where a rank was missing, `Ok(Err(why))`: worth trying again.
    fn join(
        &self,
        hosts: &HostFile,
        place: usize,
        rank_watchdog: (usize, Watchdog),
    ) -> anyhow::Result<Result<Joined, String>> {
        let joined = super::cluster_cmd::join(&self.cluster, rank_watchdog, hosts, &self.identity, self.room);
        match joined {
            Err(e) if matches!(e.downcast_ref::<FormError>(), Some(FormError::Absent(_))) => {
                Ok(Err(format!("rank {place}: the cluster did not form: {e}")))
            }
            joined => joined.map(Ok),
        }
    }
}

/// A worker: checks in on rank 0's roster until it is told to form, then its layers, on rank
/// 0's steps, until rank 0 stops; it starts again when the others are lost.
fn serve_stage(
    args: ServeArgs,
    path: &Path,
    file: &HostFile,
    (place, watchdog): (usize, Watchdog),
) -> anyhow::Result<()> {
    let kv_format = args.kv.format()?;
    let ask = JoinAsk::of(&args, path)?;
    // Rank 0 giving the forming up, starting again or gone starts this again (at once while
    // MLX forms), rather than at MLX's deadline on a neighbour that still holds its link open.
    crate::cluster::presence::on_rank_0_gone(move |why| rejoin::restart(&format!("rank {place}: {why}")));
    let membership = roster::await_turn(file, args.roster.port(file), place, ask.room, ask.identity.clone())
        .map_err(anyhow::Error::msg)?;
    let rank = membership.rank_of(place).expect("told to form as a member");
    let Joined { group, rooms, watchdog, .. } = match ask.join(&membership.hosts(file), place, (rank, watchdog))? {
        Ok(joined) => {
            crate::cluster::presence::formed();
            joined
        }
        Err(why) => {
            std::thread::sleep(RETRY_PAUSE);
            rejoin::restart(&why)
        }
    };
    let backend = Backend::init();
    let parallel = args.cluster.parallel;
    let loaded = load_checked(path, &backend, &args.weights.load_options(), (&rooms, &group, parallel), kv_format);
    let (model, held, _) = match crate::cluster::agree_on_load(&group, &watchdog, loaded, &membership.members) {
        Ok(loaded) => loaded,
        Err(Unloaded::Lost(e)) => rejoin::restart(&format!("rank {place}: the cluster lost a rank: {e}")),
        // Rank 0 forms again, without that rank if it stays away.
        Err(Unloaded::Other(e)) => rejoin::restart(&format!("rank {place}: {e}")),
        Err(e) => return Err(e).with_context(|| format!("loading {}", path.display())),
    };
    let left_out: Vec<String> = membership.left_out(file).iter().map(|&p| roster::name(file, p)).collect();
    let me = match left_out.is_empty() {
        true => format!("rank {place} of {}", group.size()),
        false => format!("rank {place} (rank {rank} of {}, without {})", group.size(), left_out.join(", ")),
    };
    eprintln!("{me}: {} {held}, serving rank 0's engine", model.name);
    // Its room for keys and values bounds what rank 0 admits: this machine's memory is not
    // governed by an engine of its own.
    let residency = args.residency_config()?;
    let engine = residency.engine;
    let room = crate::engine::memory::stage_kv_capacity(&model.transformer, &engine, residency.memory_budget as usize);
    eprintln!("rank {place}: room for {room} tokens of keys and values");
    if let Err(e) = crate::cluster::gather_kv_capacity(&group, &watchdog, Some(room)) {
        rejoin::restart(&format!("rank {place}: the cluster lost a rank: {e}"))
    }
    // Its own prefix cache of its layers, keyed as rank 0's: a hit there is a hit here.
    let context = engine.context_length(model.transformer.config.max_position_embeddings);
    let prefix = crate::engine::kv::prefix_cache_for(&model, context, &engine, engine.prefix_cache_bytes);
    let hidden = model.transformer.config.hidden_size;
    let pipeline = Pipeline::new(group, watchdog, hidden).with_places(membership.members.clone());
    let mut pipeline = sharing(pipeline, parallel, &model.transformer);
    match pipeline.serve_stage(&model.transformer, kv_format, prefix) {
        Ok(()) => {
            crate::cluster::presence::stopping();
            Ok(())
        }
        Err(e) => rejoin::restart(&format!("rank {place}: the cluster lost a rank: {e}")),
    }
}

/// This rank's part of the model (split `parallel` across `group`, whose rooms are `rooms`),
/// its KV format checked before the ranks agree that all loaded (so a format the model cannot
/// hold fails every rank at once).
fn load_checked(
    path: &Path,
    backend: &Backend,
    options: &crate::model::LoadOptions,
    (rooms, group, parallel): (&[u64], &std::sync::Arc<crate::mlx::distributed::Group>, Parallel),
    kv_format: crate::model::KvFormat,
) -> Result<(crate::model::LoadedModel, String, Vec<crate::model::Stage>), ModelError> {
    let (model, held, plan) = crate::cluster::load_part(path, backend, options, rooms, group, parallel)?;
    model.transformer.config.check_kv_format(kv_format).map_err(ModelError::Invalid)?;
    Ok((model, held, plan))
}

/// `pipeline`, its steps summed across the ranks where the model is shared out by tensors.
fn sharing(pipeline: Pipeline, parallel: Parallel, model: &crate::model::Transformer) -> Pipeline {
    match parallel {
        Parallel::Tensor => pipeline.sharing_layers(model),
        Parallel::Pipeline => pipeline,
    }
}

/// Rank 0: its roster and the HTTP server at once (the model answered 503 with the reason
/// while the cluster forms), then the cluster of the machines the roster decides on, the
/// model's first stage and the engine; after a lost rank, a fresh start of this process to form
/// the cluster again.
async fn serve_first_stage(
    args: ServeArgs,
    (given, path): (String, PathBuf),
    file: HostFile,
    watchdog: Watchdog,
) -> anyhow::Result<()> {
    let models = args.residency()?;
    let id = models.catalog().find_or_add_path(&given)?.id;
    let start = Membership::from_var(roster::MEMBERSHIP_VAR, &file).unwrap_or_else(|| Membership::everyone(&file));
    // After a take-in: the list that served before, if this larger one cannot form.
    let fallback = Membership::from_var(roster::FALLBACK_VAR, &file);
    let restarted = rejoin::restarted_after();
    let port = args.roster.port(&file);
    models.await_split(&id, with_cause(restarted.as_deref(), "waiting for the machines to check in".into()));
    let ask = JoinAsk::of(&args, &path)?;
    let roster = Roster::open(&file, port, start, ask.identity.clone()).map_err(anyhow::Error::msg)?;
    let server = start_server(&args, &models).await?;
    eprintln!("FastMLX at {}: {id} is served once the cluster has formed (roster on port {port})", server.url());

    let membership = {
        let (options, drop_after) = (args.weights.load_options(), args.roster.drop_after());
        let split = (path.as_path(), options, args.cluster.parallel, file.ranks.len());
        // A take-in whose links cannot be made gives up at the deadline, and serves as before.
        let give_up = fallback.as_ref().map(|_| watchdog.timeout());
        let limits = (drop_after, give_up);
        let decision = tokio::select! {
            membership = decided(&models, &id, &roster, split, limits, ask.room, restarted.as_deref()) => membership,
            _ = shutdown_signal() => return stop_server(models, server).await,
        };
        // Its addresses let go: MLX binds them now (or this image ends).
        roster.release_own();
        match decision {
            Ok(membership) => membership,
            Err((membership, why)) => {
                let (next, why) = after_failed_forming(&file, &membership, fallback.as_ref(), why);
                start_again(&models, server, &id, next, why).await
            }
        }
    };
    if membership.members.len() == 1 {
        let shown = (args.cluster.backend.as_str(), args.cluster.parallel, ask.room);
        return serve_alone(models, server, &id, (&roster, &file, args.roster.take_back), shown).await;
    }
    // While the cluster forms, a wait past its deadline starts this process again, as does a
    // member gone (at once, rather than at MLX's deadline).
    let (expired_tx, mut expired) = tokio::sync::mpsc::unbounded_channel();
    let gone_tx = expired_tx.clone();
    roster.on_lost(move |why| {
        let _ = gone_tx.send(format!("rank 0: the cluster did not form: {why}"));
    });
    watchdog.on_expiry(move |error| {
        let _ = expired_tx.send(error);
    });
    roster.set_forming(true);
    let hosts = membership.hosts(&file);
    let joined = tokio::select! {
        // Every member present (its addresses let go, no probe of its running) before MLX starts.
        present = all_present(&roster, &membership) => match present {
            Ok(()) => {
                // MLX starts here first, so that rank 0 listens before the ring's last rank
                // connects to it (refused, MLX would wait a second before it tried again).
                let mut joining = tokio::task::spawn_blocking(move || ask.join(&hosts, 0, (0, watchdog)));
                tokio::time::sleep(MLX_LISTENS).await;
                match roster.tell_form(&membership) {
                    Ok(()) => tokio::select! {
                        joined = &mut joining => joined,
                        Some(error) = expired.recv() => Ok(Ok(Err(error))),
                    },
                    Err(why) => Ok(Ok(Err(format!("rank 0: the cluster did not form: {why}")))),
                }
            }
            Err(why) => Ok(Ok(Err(format!("rank 0: the cluster did not form: {why}")))),
        },
        Some(error) = expired.recv() => Ok(Ok(Err(error))),
    };
    // Formed or not, the workers checking in from now on wait for the next forming.
    roster.set_forming(false);
    let Joined { group, rooms, watchdog, links, .. } = match joined?? {
        Ok(joined) => joined,
        Err(why) => {
            tokio::time::sleep(RETRY_PAUSE).await;
            let (next, why) = after_failed_forming(&file, &membership, fallback.as_ref(), why);
            start_again(&models, server, &id, next, why).await
        }
    };
    let size = group.size();
    let (distributed, parallel) = (args.cluster.backend.clone(), args.cluster.parallel);
    let kv_format = args.kv.format()?;
    let (cluster, shown, present) = (membership.clone(), file.clone(), roster.clone());
    // A link lost, or another rank's failed load, while the ranks load starts this again; rank
    // 0's own failed load ends it.
    let lost_while_loading = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let lost = lost_while_loading.clone();
    let load = move |path: PathBuf, options| -> Result<(_, Box<dyn RemoteLayers>), ModelError> {
        let link_lost = |e: String| {
            *lost.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
            ModelError::Invalid(e)
        };
        let backend = Backend::init();
        let loaded = load_checked(&path, &backend, &options, (&rooms, &group, parallel), kv_format);
        let (model, held, plan) = match crate::cluster::agree_on_load(&group, &watchdog, loaded, &cluster.members) {
            Ok(loaded) => loaded,
            Err(Unloaded::Lost(e)) => return Err(link_lost(format!("the cluster lost a rank while loading: {e}"))),
            // The cluster forms again: without that rank once it stays away past --drop-after.
            Err(Unloaded::Other(e)) => return Err(link_lost(e)),
            Err(Unloaded::Failed(e)) => return Err(e),
        };
        eprintln!("rank 0 of {size}: {} {held}", model.name);
        let room = crate::cluster::gather_kv_capacity(&group, &watchdog, None)
            .map_err(|e| link_lost(format!("the cluster lost a rank while loading: {e}")))?;
        let hidden = model.transformer.config.hidden_size;
        let status = crate::cluster::status_of((&distributed, parallel), &shown, &cluster, &rooms, &plan, &links);
        // Idle, the workers are parked off the ring (its wait spins a core); a line on their
        // presence connections wakes them for the next step.
        let waking = present.clone();
        let pipeline = Pipeline::new(group, watchdog.clone(), hidden)
            .with_view(ClusterView::new(status))
            .with_kv_capacity(room)
            .with_places(cluster.members.clone())
            .with_waker(move |park| waking.wake(park));
        let pipeline = sharing(pipeline, parallel, &model.transformer);
        // Rank 0 stays up when a rank is lost: its requests end with the reason, the
        // server says it, and the wait that never returns is left behind.
        let health = pipeline.health();
        // The roster names who is gone in a failure's reason, and fails the link itself the
        // moment a member goes without a goodbye (before any wait on the ring notices).
        let named = present.clone();
        health.set_witness(move || named.lost());
        let lost = health.clone();
        present.on_lost(move |why| lost.fail(format!("the cluster lost a rank: {why}")));
        watchdog.on_expiry(move |error| health.fail(format!("the cluster lost a rank: {error}")));
        Ok((model, Box::new(pipeline)))
    };
    // Until the engine takes over the link, a wait past the deadline still starts this again.
    let first = tokio::select! {
        first = models.load_split(&id, load) => first,
        Some(error) = expired.recv() => {
            let (next, why) = after_failed_forming(&file, &membership, fallback.as_ref(), error);
            start_again(&models, server, &id, next, why).await
        }
    };
    let lost = lost_while_loading.lock().unwrap_or_else(|p| p.into_inner()).take();
    let first = match (first, lost) {
        (Ok(first), _) => first,
        (Err(_), Some(why)) => {
            let (next, why) = after_failed_forming(&file, &membership, fallback.as_ref(), why);
            start_again(&models, server, &id, next, why).await
        }
        (Err(e), None) => return Err(e).with_context(|| format!("loading {id} across the cluster")),
    };
    eprintln!("FastMLX serving {} at {} on {} machines", first.id, server.url(), membership.members.len());
    let lost = first.engine.fault_watch();
    drop(first);
    tokio::select! {
        _ = shutdown_signal() => stop_server(models, server).await,
        fault = lost_rank(lost) => {
            // No machine is taken back by this image any more.
            models.clear_back();
            // Its streams have their error events; the others' requests finish first (a
            // signal meanwhile still stops the server).
            tokio::select! {
                _ = shutdown_signal() => stop_server(models, server).await,
                () = drained(&models, &id) => {
                    start_again(&models, server, &id, Next::list(&membership).after_serving(&membership), fault).await
                }
            }
        }
        back = returned(&models, (&roster, &file), args.roster.take_back) => {
            take_in(models, server, &id, &membership, &file, back).await
        }
    }
}

/// `why` after the cause rank 0 started again for, if it did.
fn with_cause(restarted: Option<&str>, why: String) -> String {
    match restarted {
        Some(cause) => format!("{cause}; {why}"),
        None => why,
    }
}

/// The machines the cluster forms with, once the roster decides (every member checked in; a
/// member gone past `drop_after` left out where the model fits on the rest); meanwhile the
/// model is answered 503 with what rank 0 waits for.
async fn decided(
    models: &Residency,
    id: &str,
    roster: &Roster,
    (path, options, parallel, most_ranks): (&Path, crate::model::LoadOptions, Parallel, usize),
    (drop_after, give_up): (Option<Duration>, Option<Duration>),
    own_room: u64,
    restarted: Option<&str>,
) -> Result<Membership, (Membership, String)> {
    // Whether the model fits on fewer machines is planned from its shape, read (built, not
    // loaded) only once a machine has been gone that long: a GGUF file is read whole to build.
    let path = path.to_path_buf();
    let mut shaping: Option<tokio::task::JoinHandle<Result<Shape, String>>> = None;
    let mut shape: Option<Result<Shape, String>> = None;
    let mut said = String::new();
    // A take-in that has not formed after `give_up`, for whatever reason, falls back.
    let started = std::time::Instant::now();
    roster.set_probing(true);
    loop {
        if shaping.as_ref().is_some_and(|h| h.is_finished()) {
            let handle = shaping.take().expect("checked");
            shape = Some(handle.await.unwrap_or_else(|e| Err(e.to_string())));
        }
        let mut wanted = false;
        let mut fits = |rooms: &[u64]| match &shape {
            Some(Ok(shape)) => shape
                .plan_for(parallel, rooms)
                .map(|_| ())
                .map_err(|e| format!("the model does not fit on the others ({e})")),
            Some(Err(e)) => Err(format!("the model's size could not be read: {e}")),
            None => {
                wanted = true;
                Err("reading the model's size to see whether the others hold it".into())
            }
        };
        // MLX's start would fail without saying which rank could not listen, or which link it
        // could not make: while a cluster of several is to form, rank 0 holds its own
        // addresses (alone, it needs none), and the cluster forms once every machine reached
        // its right neighbour's (rank 0 probes rank 1's itself).
        let own = (roster.membership().members.len() > 1).then(|| roster.own_problem()).flatten();
        if own.is_none() {
            let prober = roster.clone();
            let _ = tokio::task::spawn_blocking(move || prober.probe_own_link()).await;
        }
        // A take-in waits for its links until it gives up (and holds the machine off): left
        // out, the machine would be back, and taken in, again and again.
        let decision = match roster.decide((drop_after, give_up.is_none()), own_room, &mut fits) {
            Decision::Form(m) if m.members.len() > 1 => match own.or_else(|| roster.unreached(&m)) {
                Some(why) => Decision::Wait(format!("{why}; waiting until it can")),
                None => Decision::Form(m),
            },
            decision => decision,
        };
        if wanted && shaping.is_none() {
            let path = path.clone();
            shaping = Some(tokio::task::spawn_blocking(move || {
                let model = crate::model::build_unread(&path, &Backend::init(), &options);
                model.map(|t| Shape::of(&t, most_ranks)).map_err(|e| e.to_string())
            }));
        }
        match decision {
            Decision::Form(membership) => {
                eprintln!(
                    "rank 0: forming the cluster with {}",
                    membership.members.iter().map(|p| format!("rank {p}")).collect::<Vec<_>>().join(", ")
                );
                roster.set_probing(false);
                return Ok(membership);
            }
            Decision::Wait(why) if give_up.is_some_and(|limit| started.elapsed() > limit) => {
                roster.set_probing(false);
                return Err((roster.membership(), why));
            }
            Decision::Wait(why) => {
                let why = with_cause(restarted, why);
                if why != said {
                    models.await_split(id, why.clone());
                    said = why;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// How long rank 0 waits for the members told to form to be present.
const PRESENT_WITHIN: Duration = Duration::from_secs(15);

/// How long rank 0's MLX has to listen before the workers are told to form.
const MLX_LISTENS: Duration = Duration::from_millis(200);

/// Once every worker of `membership` is present at the roster (told to form, its MLX addresses
/// let go): then, and only then, MLX may start on every rank.
async fn all_present(roster: &Roster, membership: &Membership) -> Result<(), String> {
    let started = std::time::Instant::now();
    loop {
        let absent = roster.absent(membership);
        if absent.is_empty() {
            return Ok(());
        }
        let name = |&(p, _): &(usize, bool)| roster::name(roster.hosts(), p);
        let silent: Vec<String> = absent.iter().filter(|a| a.1).map(name).collect();
        if !silent.is_empty() {
            let silence = roster::FRESH.as_secs();
            return Err(format!("{} did not come to form: not heard from for {silence} s", silent.join(", ")));
        }
        if started.elapsed() > PRESENT_WITHIN {
            let names: Vec<String> = absent.iter().map(name).collect();
            return Err(format!("{} did not come to form within {} s", names.join(", "), PRESENT_WITHIN.as_secs()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every other machine is gone past `--drop-after` and the model fits on rank 0: it is
/// served here as any model, until a machine is back and the server idle.
async fn serve_alone(
    models: Residency,
    server: RunningServer,
    id: &str,
    (roster, file, take_back): (&Roster, &HostFile, TakeBack),
    (backend, parallel, room): (&str, Parallel, u64),
) -> anyhow::Result<()> {
    eprintln!("rank 0: every other machine is gone; serving {id} on this machine alone");
    let alone = roster.membership();
    // Loaded now, as `serve` loads its first model (a failure is told to each request too).
    match models.load_whole_instead(id, "every other machine is gone: loading it on rank 0 alone").await {
        Ok(served) => {
            eprintln!("FastMLX serving {} at {} alone", served.id, server.url());
            // Kept loaded as the cluster's model, shown as a cluster of this machine without
            // the others, until they are back.
            let whole = [crate::model::Stage { layers: 0..served.engine.model_info().layers, ends: true }];
            let status = crate::cluster::status_of((backend, parallel), file, &alone, &[room], &whole, &[]);
            // How machines are taken back, said from the first moment it shows as alone.
            models.set_returns(Vec::new(), Vec::new(), take_back.as_str());
            models.pin_alone(id, status);
        }
        Err(e) => {
            eprintln!("rank 0: {id} could not be loaded alone: {e}");
            // Answered 503 with the reason until a machine is back, rather than loaded by the
            // next request outside the cluster (unpinned, and likely to fail the same way).
            models.await_split(
                id,
                format!("every other machine is gone and it could not be loaded on rank 0 alone: {e}"),
            );
        }
    }
    tokio::select! {
        _ = shutdown_signal() => stop_server(models, server).await,
        back = returned(&models, (roster, file), take_back) => take_in(models, server, id, &alone, file, back).await,
    }
}

/// Machines of the host file left out of the cluster and checking in again (shown in the
/// cluster's status): every one once a person asks, those held off since a take-in failed
/// included (the person may have mended its cause); with `take_back` idle, also once the server
/// has been idle for [`REJOIN_IDLE`], one at a time (the lowest rank, none held off), so a
/// take-in that fails holds off only the machine it tried.
async fn returned(models: &Residency, (roster, file): (&Roster, &HostFile), take_back: TakeBack) -> Vec<usize> {
    let (mut idle_since, mut first) = (None, true);
    loop {
        // Published at once, so the status says how machines are taken back from the start.
        if !std::mem::take(&mut first) {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let (back, held) = (roster.returned(), roster.held_back());
        let shown_held = held
            .iter()
            .map(|&(p, left)| HeldBack { machine: roster::name(file, p), seconds_left: left.as_secs() })
            .collect();
        models.set_returns(back.iter().map(|&p| roster::name(file, p)).collect(), shown_held, take_back.as_str());
        if (!back.is_empty() || !held.is_empty()) && models.take_back_asked() {
            let mut asked: Vec<usize> = back.iter().copied().chain(held.iter().map(|h| h.0)).collect();
            asked.sort_unstable();
            return asked;
        }
        if take_back == TakeBack::Asked {
            continue;
        }
        let busy = models.loaded().iter().any(|m| m.running + m.queued > 0);
        if back.is_empty() || busy {
            idle_since = None;
            continue;
        }
        let since = *idle_since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() >= REJOIN_IDLE {
            return back[..1].to_vec();
        }
    }
}

/// Rank 0 starts again to form the cluster with the machines `back` as well.
async fn take_in(
    models: Residency,
    server: RunningServer,
    id: &str,
    membership: &Membership,
    file: &HostFile,
    back: Vec<usize>,
) -> anyhow::Result<()> {
    let names: Vec<String> = back.iter().map(|&p| roster::name(file, p)).collect();
    let why = format!("{} is back", names.join(", "));
    // Being taken in: an ask meanwhile has nothing more to do.
    models.clear_back();
    // New requests are answered 503 until the larger cluster serves; one that came in
    // meanwhile finishes first (a signal meanwhile stops the server).
    models.await_split(id, format!("{why}; forming the cluster again with it"));
    tokio::select! {
        _ = shutdown_signal() => stop_server(models, server).await,
        () = drained(&models, "") => {
            let next = Next { fallback: Some(membership.to_env()), ..Next::list(&membership.with(&back)) };
            let next = next.after_serving(membership);
            start_again(&models, server, id, next, why).await
        }
    }
}

/// What rank 0's next image forms with: the list, after a take-in the list that served before,
/// and machines not to take back for a while.
struct Next {
    members: String,
    fallback: Option<String>,
    hold: Option<String>,
}

impl Next {
    fn list(membership: &Membership) -> Next {
        Next { members: membership.to_env(), fallback: None, hold: None }
    }

    /// From an image that served `served`: its machines' holds end (they formed and loaded,
    /// one taken in by a person's ask included), so a machine lost later and back is taken
    /// back as any other, and a later failure holds it off 5 minutes again, not from the old
    /// count.
    fn after_serving(self, served: &Membership) -> Next {
        Next { hold: Some(roster::Holds::from_env().without(&served.members).to_env()), ..self }
    }
}

/// The cluster of `membership` did not form (`why`): formed again with the same machines, or,
/// where it was a take-in, with the list that served before (`fallback`), the machines taken
/// in held off ([`roster::Holds`]): the roster sees them, yet MLX could not reach them.
fn after_failed_forming(
    file: &HostFile,
    membership: &Membership,
    fallback: Option<&Membership>,
    why: String,
) -> (Next, String) {
    let Some(fallback) = fallback else { return (Next::list(membership), why) };
    let taken: Vec<usize> = membership.members.iter().copied().filter(|p| !fallback.members.contains(p)).collect();
    if taken.is_empty() {
        return (Next::list(membership), why);
    }
    let names: Vec<String> = taken.iter().map(|&p| roster::name(file, p)).collect();
    let back = Membership { generation: membership.generation + 1, members: fallback.members.clone() };
    let now = std::time::SystemTime::now();
    let holds = roster::Holds::from_env().failed(&taken, now);
    let minutes = holds.remaining(taken[0], now).as_secs().div_ceil(60);
    let why = format!(
        "{} could not be taken back ({why}); serving without it again, and trying it again in {minutes} min",
        names.join(", ")
    );
    let hold = holds.to_env();
    (Next { members: back.to_env(), fallback: None, hold: Some(hold) }, why)
}

/// Rank 0 starts again in place to form the cluster again (`why` it must) as `next` says, its
/// port open throughout: meanwhile the model is answered 503 with the reason.
async fn start_again(models: &Residency, server: RunningServer, id: &str, next: Next, why: String) -> ! {
    models.await_split(id, format!("{why}; starting again to form the cluster"));
    server.hand_over(Duration::from_secs(5)).await;
    let mut env = vec![(roster::MEMBERSHIP_VAR, next.members)];
    let mut clear = vec![];
    match next.fallback {
        Some(fallback) => env.push((roster::FALLBACK_VAR, fallback)),
        None => clear.push(roster::FALLBACK_VAR),
    }
    env.extend(next.hold.map(|hold| (roster::HOLD_VAR, hold)));
    rejoin::restart_with(&why, &env, &clear)
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
