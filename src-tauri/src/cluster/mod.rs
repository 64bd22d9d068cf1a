//! FastMLX across several Macs, on MLX's own distributed layer (`mlx::distributed`): one
//! process per machine, the host file in MLX's format. What exists so far is the preflight every
//! rank runs before serving together (`fastmlx cluster check`): join the group, agree on the
//! version, the model and the settings (a mismatch named, on every rank), and measure each
//! link from rank 0 (round trip and throughput), the figures the layer split will use.

pub mod hostfile;
pub mod identity;

use std::path::Path;
use std::time::{Duration, Instant};

use mlx_rs::{Array, Dtype};

use crate::mlx::distributed::{DistributedBackend, Group};
use hostfile::HostFile;
use identity::{NodeIdentity, WIRE_BYTES};

/// Bytes sent one way to measure a link's throughput.
const PROBE_BYTES: usize = 16 << 20;
/// Round trips timed per link (the median is reported).
const PINGS: usize = 9;

/// One link from rank 0, measured.
#[derive(Debug, Clone)]
pub struct Link {
    pub peer: usize,
    pub round_trip: Duration,
    pub bytes_per_second: f64,
}

/// What the preflight found.
#[derive(Debug, Clone)]
pub struct CheckReport {
    pub rank: usize,
    pub size: usize,
    /// Rank 0 only (the others take part in its measurements).
    pub links: Vec<Link>,
}

/// Makes MLX see the group: the host file (ring format) and this process's rank, in the
/// environment MLX reads when the group is joined.
pub fn describe_group(hosts: &HostFile, rank: usize, scratch: &Path) -> Result<(), String> {
    if rank >= hosts.ranks.len() {
        return Err(format!("rank {rank} is not in a host file of {} ranks", hosts.ranks.len()));
    }
    let file = hosts.write_ring_file(scratch)?;
    // SAFETY: set once at start, before MLX or any other thread reads the environment.
    unsafe {
        std::env::set_var("MLX_HOSTFILE", &file);
        std::env::set_var("MLX_RANK", rank.to_string());
    }
    Ok(())
}

/// Joins the group MLX's environment describes and runs the preflight.
pub fn check(backend: DistributedBackend, identity: &NodeIdentity) -> Result<CheckReport, String> {
    let group = Group::init(backend)?;
    let (rank, size) = (group.rank(), group.size());
    agree(&group, identity)?;
    let links = if rank == 0 {
        (1..size).map(|peer| measure(&group, peer)).collect::<Result<_, _>>()?
    } else {
        (1..size).filter(|&peer| peer == rank).try_for_each(|_| answer(&group))?;
        Vec::new()
    };
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

fn eval(a: Array) -> Result<Array, String> {
    a.eval().map_err(|e| e.to_string())?;
    Ok(a)
}

/// Rank 0's side of a link's measurement.
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
    Ok(Link { peer, round_trip: trips[PINGS / 2], bytes_per_second: PROBE_BYTES as f64 / took.as_secs_f64().max(1e-9) })
}

/// A peer's side: echo the pings, take the payload, acknowledge it.
fn answer(group: &Group) -> Result<(), String> {
    let pong = Array::from_slice(&[1u8], &[1]);
    for _ in 0..PINGS {
        eval(group.recv(&[1], Dtype::Uint8, 0)?)?;
        eval(group.send(&pong, 0)?)?;
    }
    eval(group.recv(&[(PROBE_BYTES / 4) as i32], Dtype::Float32, 0)?)?;
    eval(group.send(&pong, 0)?)?;
    Ok(())
}
