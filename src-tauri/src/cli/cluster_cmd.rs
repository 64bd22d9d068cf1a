//! `fastmlx cluster check`: the preflight of a multi-Mac cluster, run on every machine (the same
//! host file, each its own `--rank`): the ranks join MLX's group, agree on the FastMLX version,
//! the model and the settings, and each link of the ring is measured (rank 0 prints them).

use std::path::PathBuf;
use std::sync::Arc;

use super::generate_cluster::ClusterArgs;

use crate::cluster::hostfile::HostFile;
use crate::cluster::identity::NodeIdentity;
use crate::cluster::watchdog::Watchdog;
use crate::cluster::FormError;
use crate::mlx::distributed::{DistributedBackend, Group};

#[derive(clap::Subcommand)]
pub enum ClusterCommand {
    /// Join the cluster, check every rank serves the same model with the same version and
    /// settings, and measure each link of the ring.
    Check(CheckArgs),
}

#[derive(clap::Args)]
pub struct CheckArgs {
    /// The host file, in MLX's ring format (`[["ip:port"], ...]`) or mlx.launch's
    /// (`[{"ssh": .., "ips": [..]}]`); default: `MLX_HOSTFILE`.
    #[arg(long)]
    hostfile: Option<PathBuf>,
    /// This machine's rank (its place in the host file); default: `MLX_RANK`.
    #[arg(long)]
    rank: Option<usize>,
    /// MLX's backend: `ring` (TCP, any network) or `jaccl` (RDMA over Thunderbolt 5).
    #[arg(long, default_value = "ring")]
    backend: String,
    /// The model folder or GGUF file this machine serves.
    #[arg(long)]
    model: PathBuf,
    /// The serving settings every rank must share (as the server will state them).
    #[arg(long, default_value = "")]
    settings: String,
    /// Give up (an error, not a hang) when the cluster has not formed and checked by then, in
    /// seconds: a machine that is off, unplugged or never started.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
}

/// This machine's rank: the flag, else `MLX_RANK` (as `mlx.launch` sets it).
pub(super) fn rank_or_env(flag: Option<usize>) -> anyhow::Result<usize> {
    let env_rank = std::env::var("MLX_RANK").ok().and_then(|r| r.parse().ok());
    flag.or(env_rank).ok_or_else(|| anyhow::anyhow!("no --rank and no MLX_RANK"))
}

/// This process as one rank of a formed cluster.
pub(super) struct Joined {
    pub group: Arc<Group>,
    /// Every rank's room for weights, in rank order.
    pub rooms: Vec<u64>,
    pub rank: usize,
    pub watchdog: Watchdog,
    /// Each link of the ring, measured as the cluster formed.
    pub links: Vec<crate::cluster::Link>,
}

/// This machine's rank (`--rank` or `MLX_RANK`) and the watchdog on its waits for the others
/// (`--timeout`).
pub(super) fn rank_and_watchdog(cluster: &ClusterArgs) -> anyhow::Result<(usize, Watchdog)> {
    let rank = rank_or_env(cluster.rank)?;
    Ok((rank, Watchdog::start(rank, std::time::Duration::from_secs(cluster.timeout))))
}

/// Joins the cluster of `hosts` as `rank` serving what `identity` says (every rank must
/// state the same), gathers every rank's room (this one's: `room` bytes) and measures each link.
/// A cluster that did not form is a [`FormError`] (whether trying again may help).
pub(super) fn join(
    cluster: &ClusterArgs,
    (rank, watchdog): (usize, Watchdog),
    hosts: &HostFile,
    identity: &NodeIdentity,
    room: u64,
) -> anyhow::Result<Joined> {
    let kind = DistributedBackend::parse(&cluster.backend).map_err(anyhow::Error::msg)?;
    let group = crate::cluster::form(hosts, rank, kind, identity, &watchdog)?;
    let rooms = {
        let _w = watchdog.waiting("the ranks have not told their memory");
        crate::cluster::gather_rooms(&group, room).map_err(FormError::Absent)?
    };
    let links = {
        let _w = watchdog.waiting("the link measurements have not finished");
        crate::cluster::check(&group).map_err(FormError::Absent)?.links
    };
    Ok(Joined { group: Arc::new(group), rooms, rank, watchdog, links })
}

pub fn run(command: ClusterCommand) -> anyhow::Result<()> {
    let ClusterCommand::Check(args) = command;
    crate::mlx::Backend::init();
    let backend = DistributedBackend::parse(&args.backend).map_err(anyhow::Error::msg)?;
    let env_path = std::env::var_os("MLX_HOSTFILE").map(PathBuf::from);
    let path = args.hostfile.or(env_path).ok_or_else(|| anyhow::anyhow!("no --hostfile and no MLX_HOSTFILE"))?;
    let hosts = HostFile::read(&path).map_err(anyhow::Error::msg)?;
    let rank = rank_or_env(args.rank)?;
    let identity = NodeIdentity::of(&args.model, &args.settings).map_err(anyhow::Error::msg)?;
    let watchdog = Watchdog::start(rank, std::time::Duration::from_secs(args.timeout));
    let report = crate::cluster::form(&hosts, rank, backend, &identity, &watchdog).map_err(|e| e.to_string()).and_then(
        |group| {
            let _w = watchdog.waiting("the link measurements have not finished");
            crate::cluster::check(&group)
        },
    );
    let report = report.map_err(anyhow::Error::msg)?;
    println!(
        "rank {} of {}: FastMLX {}, model {}: every rank agrees",
        report.rank, report.size, identity.version, identity.model
    );
    for link in report.links.iter().filter(|_| report.rank == 0) {
        println!(
            "link {} <-> {}: round trip {:.2} ms, {:.1} MB/s",
            link.from,
            link.to,
            link.round_trip.as_secs_f64() * 1e3,
            link.bytes_per_second / 1e6
        );
    }
    Ok(())
}
