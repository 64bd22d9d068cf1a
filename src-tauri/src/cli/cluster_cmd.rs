//! `fastmlx cluster check`: the preflight of a multi-Mac cluster, run on every machine (the same
//! host file, each its own `--rank`): the ranks join MLX's group, agree on the FastMLX version,
//! the model and the settings, and rank 0 measures its links.

use std::path::PathBuf;

use crate::cluster::hostfile::HostFile;
use crate::cluster::identity::NodeIdentity;
use crate::mlx::distributed::DistributedBackend;

#[derive(clap::Subcommand)]
pub enum ClusterCommand {
    /// Join the cluster, check every rank serves the same model with the same version and
    /// settings, and measure the links from rank 0.
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

pub fn run(command: ClusterCommand) -> anyhow::Result<()> {
    let ClusterCommand::Check(args) = command;
    crate::mlx::Backend::init();
    let backend = DistributedBackend::parse(&args.backend).map_err(anyhow::Error::msg)?;
    let env_path = std::env::var_os("MLX_HOSTFILE").map(PathBuf::from);
    let path = args.hostfile.or(env_path).ok_or_else(|| anyhow::anyhow!("no --hostfile and no MLX_HOSTFILE"))?;
    let hosts = HostFile::read(&path).map_err(anyhow::Error::msg)?;
    let env_rank = std::env::var("MLX_RANK").ok().and_then(|r| r.parse().ok());
    let rank = args.rank.or(env_rank).ok_or_else(|| anyhow::anyhow!("no --rank and no MLX_RANK"))?;
    let identity = NodeIdentity::of(&args.model, &args.settings).map_err(anyhow::Error::msg)?;
    // MLX reads the ring-format host file while the group forms.
    let scratch = std::env::temp_dir().join(format!("fastmlx-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    crate::cluster::describe_group(&hosts, rank, &scratch).map_err(anyhow::Error::msg)?;
    // MLX's group cannot be interrupted once it waits on a peer: the process gives up instead.
    let (timeout, dir) = (args.timeout, scratch.clone());
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(timeout));
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!("error: rank {rank}: the cluster did not form and check within {timeout} s (is every rank started, reachable, and using this host file?)");
        std::process::exit(1);
    });
    let report = crate::cluster::check(backend, &identity);
    let _ = std::fs::remove_dir_all(&scratch);
    let report = report.map_err(anyhow::Error::msg)?;
    println!(
        "rank {} of {}: FastMLX {}, model {}: every rank agrees",
        report.rank, report.size, identity.version, identity.model
    );
    for link in &report.links {
        println!(
            "link 0 <-> {}: round trip {:.2} ms, {:.1} MB/s",
            link.peer,
            link.round_trip.as_secs_f64() * 1e3,
            link.bytes_per_second / 1e6
        );
    }
    Ok(())
}
