//! FastMLX across several Macs, on MLX's own distributed layer (`mlx::distributed`): one
//! process per machine, the host file in MLX's format. Every rank joins the group and agrees
//! with rank 0 on the version, the model and the settings (a mismatch named, on every rank);
//! `fastmlx cluster check` also measures each link of the ring. The model is then split into
//! pipeline stages by each rank's room ([`plan_stages`], [`pipeline`]) or shared out by heads
//! and columns ([`Parallel::Tensor`], [`load_share`]).

pub mod hostfile;
pub mod identity;
pub mod link_watch;
pub mod mlx_address;
pub mod pipeline;
pub mod presence;
pub mod roster;
pub mod split;
pub mod stage_server;
pub mod sum_sampler;
pub mod watchdog;

use std::path::Path;
use std::time::{Duration, Instant};

use mlx_rs::{Array, Dtype};

use crate::mlx::distributed::{DistributedBackend, Group};
use crate::model::{Stage, Transformer};
use hostfile::HostFile;
use identity::{NodeIdentity, WIRE_BYTES};
use watchdog::Watchdog;

/// Bytes sent one way to measure a link's throughput.
const PROBE_BYTES: usize = 16 << 20;
/// Round trips timed per link (the median is reported).
const PINGS: usize = 9;

/// One link of the ring (a rank and the next), measured.
#[derive(Debug, Clone)]
pub struct Link {
    pub from: usize,
    pub to: usize,
    pub round_trip: Duration,
    pub bytes_per_second: f64,
}

/// What the preflight found.
#[derive(Debug, Clone)]
pub struct CheckReport {
    pub rank: usize,
    pub size: usize,
    /// Every link of the ring, on every rank.
    pub links: Vec<Link>,
}

/// Makes MLX see the group: the host file (ring format) and this process's rank, in the
/// environment MLX reads when the group is joined.
fn describe_group(hosts: &HostFile, rank: usize, scratch: &Path) -> Result<(), String> {
    if rank >= hosts.ranks.len() {
        return Err(format!("rank {rank} is not in a host file of {} ranks", hosts.ranks.len()));
    }
    let file = hosts.write_ring_file(scratch)?;
    // SAFETY: set once at start, before MLX reads it; no other thread reads the environment.
    unsafe {
        std::env::set_var("MLX_HOSTFILE", &file);
        std::env::set_var("MLX_RANK", rank.to_string());
    }
    Ok(())
}

/// Why a cluster did not form.
#[derive(Debug, thiserror::Error)]
pub enum FormError {
    /// A rank is not there (not started, unreachable, gone while the cluster formed): trying
    /// again may work.
    #[error("{0}")]
    Absent(String),
    /// The ranks met but disagree (model, version, settings), or this rank is not in the host
    /// file: trying again changes nothing.
    #[error("{0}")]
    Refused(String),
}

/// Joins the group of `hosts` as `rank`; every rank checks that it matches rank 0. Waiting for
/// the others is watched by `watchdog` (MLX cannot be interrupted once it waits on a peer).
pub fn form(
    hosts: &HostFile,
    rank: usize,
    backend: DistributedBackend,
    identity: &NodeIdentity,
    watchdog: &Watchdog,
) -> Result<Group, FormError> {
    // MLX reads the ring-format host file while the group forms.
    let scratch = std::env::temp_dir().join(format!("fastmlx-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| FormError::Refused(format!("{}: {e}", scratch.display())))?;
    describe_group(hosts, rank, &scratch).map_err(FormError::Refused)?;
    let joined = {
        let _w = watchdog
            .waiting("the cluster has not formed (is every rank started, reachable, and using this host file?)");
        Group::init(backend)
            .map_err(FormError::Absent)
            .and_then(|group| agree(&group, identity).map(|()| group).map_err(FormError::Refused))
    };
    let _ = std::fs::remove_dir_all(&scratch);
    joined
}

/// The preflight's measurements: each link of the ring in turn (MLX's ring sends only to a
/// rank's neighbours, the links the pipeline uses), timed by its lower rank, shared with all.
pub fn check(group: &Group) -> Result<CheckReport, String> {
    let (rank, size) = (group.rank(), group.size());
    // Two ranks have one link; more close the ring.
    let links = if size == 2 { 1 } else { size };
    let mut mine = [0u64; 2];
    for from in 0..links {
        let to = (from + 1) % size;
        if rank == from {
            let link = measure(group, to)?;
            mine = [link.round_trip.as_nanos() as u64, link.bytes_per_second as u64];
        } else if rank == to {
            answer(group, from)?;
        }
    }
    // Each rank's [round trip ns, bytes/s]; only a link's timing rank has them.
    let all = gather_words(group, &mine)?;
    let links = (0..links)
        .map(|from| Link {
            from,
            to: (from + 1) % size,
            round_trip: Duration::from_nanos(all[2 * from]),
            bytes_per_second: all[2 * from + 1] as f64,
        })
        .collect();
    Ok(CheckReport { rank, size, links })
}

/// Every rank's identity to every rank; each one refuses on a mismatch with rank 0, naming it.
fn agree(group: &Group, identity: &NodeIdentity) -> Result<(), String> {
    let mine = identity.to_wire()?;
    let gathered = group.all_gather(&Array::from_slice(&mine, &[1, WIRE_BYTES as i32]))?;
    gathered.eval().map_err(|e| e.to_string())?;
    let bytes: &[u8] = gathered.as_slice();
    let nodes: Vec<NodeIdentity> = bytes
        .chunks(WIRE_BYTES)
        .map(|c| NodeIdentity::from_wire(c).ok_or("a rank sent an unreadable description"))
        .collect::<Result<_, _>>()?;
    let differences: Vec<String> =
        nodes.iter().enumerate().skip(1).filter_map(|(r, node)| nodes[0].mismatch(r, node)).collect();
    if differences.is_empty() {
        Ok(())
    } else {
        Err(format!("the ranks do not match: {}", differences.join("; ")))
    }
}

/// Every rank's room for weights (each passes its own), in rank order.
pub fn gather_rooms(group: &Group, room: u64) -> Result<Vec<u64>, String> {
    gather_words(group, &[room])
}

/// Every rank's `words` (the same count on each), concatenated in rank order.
fn gather_words(group: &Group, words: &[u64]) -> Result<Vec<u64>, String> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let gathered = group.all_gather(&Array::from_slice(&bytes, &[1, bytes.len() as i32]))?;
    gathered.eval().map_err(|e| e.to_string())?;
    let all: &[u8] = gathered.as_slice();
    Ok(all.chunks(8).map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunks"))).collect())
}

/// How a model is split across the machines of a cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Parallel {
    /// Consecutive layers per machine, the residual stream passed on rank to rank.
    #[default]
    Pipeline,
    /// Every layer's heads and MLP columns shared out, partial outputs summed after each
    /// attention and MLP (`all_sum`): for fast links.
    Tensor,
}

/// What splitting a model across machines plans from: its layers' bytes and its ends' (the
/// embeddings, final norm and output head, on rank 0), or why it cannot be split.
#[derive(Debug, Clone)]
pub struct Shape {
    refusal: Option<String>,
    /// Why it cannot be shared out by tensors across `n` ranks, at `n - 1` (up to the host
    /// file's size).
    tensor_refusals: Vec<Option<String>>,
    ends: u64,
    layers: Vec<u64>,
}

impl Shape {
    /// `model`'s shape, for clusters of up to `most_ranks` machines.
    pub fn of(model: &Transformer, most_ranks: usize) -> Shape {
        Shape {
            refusal: model.stage_refusal(),
            tensor_refusals: (1..=most_ranks.max(1)).map(|n| model.tensor_refusal(n)).collect(),
            ends: model.ends_weight_bytes(),
            layers: model.layer_weight_bytes(),
        }
    }

    /// Every rank's part, split `parallel` across machines of these `rooms`.
    pub fn plan_for(&self, parallel: Parallel, rooms: &[u64]) -> Result<Vec<Stage>, String> {
        match parallel {
            Parallel::Pipeline => self.plan(rooms),
            Parallel::Tensor => self.plan_shares(rooms),
        }
    }

    /// Every rank's stage: the layers split by the ranks' room, rank 0's less the ends it holds.
    pub fn plan(&self, rooms: &[u64]) -> Result<Vec<Stage>, String> {
        if let Some(why) = &self.refusal {
            return Err(format!("this model cannot be split across machines: {why}"));
        }
        let mut room = rooms.to_vec();
        let Some(first) = room.first_mut() else { return Err("no ranks".into()) };
        *first = first.checked_sub(self.ends).ok_or_else(|| {
            format!("rank 0 has no room for the embeddings and output head ({:.2} GB)", self.ends as f64 / 1e9)
        })?;
        let ranges = split::split_layers(&self.layers, &room)?;
        Ok(ranges.into_iter().enumerate().map(|(rank, layers)| Stage { layers, ends: rank == 0 }).collect())
    }

    /// Tensor parallel: every rank holds every layer (its share of each) and the ends whole;
    /// each rank's room must hold its share.
    fn plan_shares(&self, rooms: &[u64]) -> Result<Vec<Stage>, String> {
        let n = rooms.len();
        let refusal = match self.tensor_refusals.get(n.saturating_sub(1)) {
            Some(refusal) => refusal.clone(),
            None => Some(format!("the shape was read for {} ranks at most, not {n}", self.tensor_refusals.len())),
        };
        if let Some(why) = refusal {
            return Err(format!("this model cannot be split by tensors: {why}"));
        }
        let share = self.ends + self.layers.iter().sum::<u64>().div_ceil(n.max(1) as u64);
        if let Some((rank, room)) = rooms.iter().enumerate().find(|(_, &room)| room < share) {
            return Err(format!(
                "rank {rank} has room for {:.2} GB of weights, its share of every layer and the ends is {:.2} GB",
                *room as f64 / 1e9,
                share as f64 / 1e9
            ));
        }
        Ok((0..n).map(|_| Stage { layers: 0..self.layers.len(), ends: true }).collect())
    }
}

/// Every rank's stage of `model` (built, not yet read): its layers split by the ranks' room,
/// rank 0's less the ends it holds (embeddings, final norm, output head).
pub fn plan_stages(model: &Transformer, rooms: &[u64]) -> Result<Vec<Stage>, String> {
    Shape::of(model, 1).plan(rooms)
}

fn eval(a: Array) -> Result<Array, String> {
    a.eval().map_err(|e| e.to_string())?;
    Ok(a)
}

/// The timing side of a link's measurement.
fn measure(group: &Group, peer: usize) -> Result<Link, String> {
    let ping = Array::from_slice(&[1u8], &[1]);
    let mut trips = Vec::with_capacity(PINGS);
    for _ in 0..PINGS {
        let start = Instant::now();
        eval(group.send(&ping, peer)?)?;
        eval(group.recv(&[1], Dtype::Uint8, peer)?)?;
        trips.push(start.elapsed());
    }
    trips.sort();
    let payload = Array::zeros::<f32>(&[(PROBE_BYTES / 4) as i32]).map_err(|e| e.to_string())?;
    eval(payload.clone())?;
    let start = Instant::now();
    eval(group.send(&payload, peer)?)?;
    eval(group.recv(&[1], Dtype::Uint8, peer)?)?;
    let took = start.elapsed().saturating_sub(trips[PINGS / 2] / 2);
    Ok(Link {
        from: group.rank(),
        to: peer,
        round_trip: trips[PINGS / 2],
        bytes_per_second: PROBE_BYTES as f64 / took.as_secs_f64().max(1e-9),
    })
}

/// The answering side: echo the pings, take the payload, acknowledge it.
fn answer(group: &Group, peer: usize) -> Result<(), String> {
    let pong = Array::from_slice(&[1u8], &[1]);
    for _ in 0..PINGS {
        eval(group.recv(&[1], Dtype::Uint8, peer)?)?;
        eval(group.send(&pong, peer)?)?;
    }
    eval(group.recv(&[(PROBE_BYTES / 4) as i32], Dtype::Float32, peer)?)?;
    eval(group.send(&pong, peer)?)?;
    Ok(())
}

/// Builds `path`'s model and keeps only `rank`'s pipeline stage of it, read from this
/// machine's disk; returns it with what it holds, in words, and every rank's stage.
pub fn load_stage(
    path: &Path,
    backend: &crate::mlx::Backend,
    options: &crate::model::LoadOptions,
    rooms: &[u64],
    rank: usize,
) -> Result<(crate::model::LoadedModel, String, Vec<Stage>), crate::model::ModelError> {
    let mut held = String::new();
    let mut plan = Vec::new();
    let model = crate::model::load_model_split(path, backend, options, |t| {
        plan = plan_stages(t, rooms).map_err(crate::model::ModelError::Invalid)?;
        let stage = plan
            .get(rank)
            .cloned()
            .ok_or_else(|| crate::model::ModelError::Invalid(format!("no stage for rank {rank} of {}", plan.len())))?;
        held = format!("layers {}..{} of {}", stage.layers.start, stage.layers.end, t.config.num_layers);
        t.keep_stage(stage)
    })?;
    Ok((model, held, plan))
}

/// Builds `path`'s model and keeps `group`'s rank's share of every layer's heads and columns
/// (tensor parallel), read from this machine's disk, once every rank's room holds its share;
/// returns it as [`load_stage`] does.
pub fn load_share(
    path: &Path,
    backend: &crate::mlx::Backend,
    options: &crate::model::LoadOptions,
    rooms: &[u64],
    group: std::sync::Arc<Group>,
) -> Result<(crate::model::LoadedModel, String, Vec<Stage>), crate::model::ModelError> {
    let mut plan = Vec::new();
    let size = group.size();
    let model = crate::model::load_model_split(path, backend, options, |t| {
        plan = Shape::of(t, size).plan_for(Parallel::Tensor, rooms).map_err(crate::model::ModelError::Invalid)?;
        t.shard_tensors(group)
    })?;
    Ok((model, format!("1/{size} of every layer's heads and MLP columns"), plan))
}

/// This rank's part of `path`'s model, split `parallel` across the ranks of `group` (whose
/// rooms are `rooms`).
pub fn load_part(
    path: &Path,
    backend: &crate::mlx::Backend,
    options: &crate::model::LoadOptions,
    rooms: &[u64],
    group: &std::sync::Arc<Group>,
    parallel: Parallel,
) -> Result<(crate::model::LoadedModel, String, Vec<Stage>), crate::model::ModelError> {
    match parallel {
        Parallel::Pipeline => load_stage(path, backend, options, rooms, group.rank()),
        Parallel::Tensor => load_share(path, backend, options, rooms, group.clone()),
    }
}

/// What rank 0 shows people of the cluster as it formed: each machine's address, room and
/// layers (`plan`), each link as measured; its machines named by their ranks in the host file
/// (`membership`), and the file's machines it serves without.
pub fn status_of(
    (backend, parallel): (&str, Parallel),
    file: &HostFile,
    membership: &roster::Membership,
    rooms: &[u64],
    plan: &[Stage],
    links: &[Link],
) -> crate::engine::remote::ClusterStatus {
    let place = |rank: usize| roster::place_of(&membership.members, rank);
    use crate::engine::remote::{ClusterLink, ClusterNode, ClusterStatus};
    let nodes = plan
        .iter()
        .enumerate()
        .map(|(rank, stage)| ClusterNode {
            rank: place(rank),
            host: file.ranks.get(place(rank)).map(|a| a.join(", ")).unwrap_or_default(),
            room_bytes: rooms.get(rank).copied().unwrap_or(0),
            first_layer: stage.layers.start,
            end_layer: stage.layers.end,
            ends: stage.ends,
        })
        .collect();
    let links = links
        .iter()
        .map(|l| ClusterLink {
            from: place(l.from),
            to: place(l.to),
            round_trip_ms: l.round_trip.as_secs_f64() * 1e3,
            megabytes_per_second: l.bytes_per_second / 1e6,
        })
        .collect();
    let without = membership.left_out(file).into_iter().map(|p| roster::name(file, p)).collect();
    let parallel = format!("{parallel:?}").to_lowercase();
    ClusterStatus { backend: backend.to_string(), parallel, nodes, links, without, ..Default::default() }
}

/// Why the ranks did not all load.
#[derive(Debug, thiserror::Error)]
pub enum Unloaded {
    /// The link failed while the ranks told each other: the cluster lost a rank (forming it
    /// again may serve).
    #[error("the cluster lost a rank while the ranks loaded: {0}")]
    Lost(String),
    /// This rank could not load its part (trying again changes nothing).
    #[error(transparent)]
    Failed(#[from] crate::model::ModelError),
    /// Another rank could not load its part: the others may serve without it.
    #[error("{0}")]
    Other(String),
}

/// This rank's `loaded`, once every rank has told whether it loaded (waited for under
/// `watchdog`; a rank that failed is named here, so the others stop now rather than at their
/// deadline): its own error first, else the ranks that failed (named by their `places` in the
/// host file, where given), else a lost link.
pub fn agree_on_load<T>(
    group: &Group,
    watchdog: &Watchdog,
    loaded: Result<T, crate::model::ModelError>,
    places: &[usize],
) -> Result<T, Unloaded> {
    let agreed = {
        let _w = watchdog.waiting("the other ranks have not finished loading");
        gather_words(group, &[loaded.is_ok() as u64])
    };
    let loaded = loaded?;
    let all = agreed.map_err(Unloaded::Lost)?;
    let failed: Vec<String> = all
        .iter()
        .enumerate()
        .filter(|(_, &ok)| ok == 0)
        .map(|(r, _)| roster::place_of(places, r).to_string())
        .collect();
    if failed.is_empty() {
        Ok(loaded)
    } else {
        let why = format!("rank {} could not load its part of the model (its own log says why)", failed.join(", "));
        Err(Unloaded::Other(why))
    }
}

/// After every rank's load, each rank's room for keys and values in tokens (rank 0 passes
/// none: its engine counts its own): the fewest over the others, which rank 0's engine admits
/// at most, so that no machine's memory is overrun by the batch's KV.
pub fn gather_kv_capacity(group: &Group, watchdog: &Watchdog, mine: Option<usize>) -> Result<usize, String> {
    let _w = watchdog.waiting("the other ranks have not told their room for the KV cache");
    let all = gather_words(group, &[mine.map_or(u64::MAX, |t| t as u64)])?;
    Ok(all.into_iter().min().unwrap_or(u64::MAX).min(usize::MAX as u64) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tensor_plan_gives_every_rank_every_layer_when_each_holds_its_share() {
        // 4 layers of 100 bytes, 50 bytes of ends; whole heads split in 2 but not in 3.
        let shape = Shape {
            refusal: None,
            tensor_refusals: vec![None, None, Some("3 heads do not split into 3".into())],
            ends: 50,
            layers: vec![100; 4],
        };
        let plan = shape.plan_for(Parallel::Tensor, &[250, 250]).unwrap();
        assert_eq!(plan, vec![Stage { layers: 0..4, ends: true }; 2]);
        // Each rank holds the ends and half the layers: 250 bytes.
        let short = shape.plan_for(Parallel::Tensor, &[250, 249]).unwrap_err();
        assert!(short.starts_with("rank 1 has room for"), "{short}");
        let refused = shape.plan_for(Parallel::Tensor, &[1000; 3]).unwrap_err();
        assert!(refused.contains("cannot be split by tensors: 3 heads"), "{refused}");
        assert!(shape.plan_for(Parallel::Tensor, &[1000; 4]).is_err());
        // Alone, the whole model; by stages, the layers split as before.
        assert_eq!(shape.plan_for(Parallel::Tensor, &[450]).unwrap(), vec![Stage { layers: 0..4, ends: true }]);
        let stages = shape.plan_for(Parallel::Pipeline, &[250, 250]).unwrap();
        assert_eq!((stages[0].layers.start, stages[1].layers.end), (0, 4));
        assert!(stages[0].ends && !stages[1].ends && stages[0].layers.end == stages[1].layers.start);
    }
}
