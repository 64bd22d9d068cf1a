//! Machines on a network of their own, all on this machine: each rank but rank 0 in a network
//! namespace of its own, plugged by a virtual cable (a veth pair) into a bridge that rank 0
//! (this namespace) sits on, as Macs on a switch or a Thunderbolt bridge. Unlike loopback, its
//! failures are real ones: a cable pulled answers nothing either way (the kernel drops what
//! crosses it, connections stall rather than close), and a link cut between two machines
//! answers "no route" on both. Needs root (`ip netns` mounts as well: CAP_SYS_ADMIN beside
//! CAP_NET_ADMIN), as here and in CI, and iproute2's `ip`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// A bridge and a namespace for each rank but rank 0; taken down when dropped.
pub struct Lan {
    /// Names this network's bridge, namespaces and cables apart from any other test's:
    /// `fx<pid>n<n>`, so that a run killed before it could take its networks down has them
    /// swept by the next ([`sweep`]).
    name: String,
    /// The first three bytes of its IPv4 subnet, a /24 of the benchmarking range 198.18.0.0/15
    /// (no real network's) that no route here uses yet.
    subnet: String,
    ranks: usize,
}

impl Lan {
    /// A network of `ranks` machines, rank 0 in this namespace.
    pub fn new(ranks: usize) -> Lan {
        static MADE: AtomicU32 = AtomicU32::new(0);
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(sweep);
        let (pid, made) = (std::process::id(), MADE.fetch_add(1, Ordering::SeqCst));
        // A network interface's name is 15 bytes at most: `fx` + 7 digits + `n` + 3 + `b`.
        let name = format!("fx{pid}n{made}");
        let lan = Lan { name, subnet: free_subnet(pid + 31 * made), ranks };
        lan.ip(&["link", "add", &lan.bridge(), "type", "bridge"]);
        lan.ip(&["addr", "add", &format!("{}/24", lan.address(0)), "dev", &lan.bridge()]);
        lan.ip(&["link", "set", &lan.bridge(), "up"]);
        for rank in 1..ranks {
            let (namespace, cable) = (lan.namespace(rank), lan.cable(rank));
            lan.ip(&["netns", "add", &namespace]);
            lan.ip(&["link", "add", &cable, "type", "veth", "peer", "name", "eth0", "netns", &namespace]);
            lan.ip(&["link", "set", &cable, "master", &lan.bridge(), "up"]);
            let inside = |args: &[&str]| lan.ip(&[&["-n", namespace.as_str()], args].concat());
            inside(&["addr", "add", &format!("{}/24", lan.address(rank)), "dev", "eth0"]);
            inside(&["link", "set", "eth0", "up"]);
            inside(&["link", "set", "lo", "up"]);
        }
        lan
    }

    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Rank `rank`'s IPv4 address.
    pub fn address(&self, rank: usize) -> String {
        format!("{}.{}", self.subnet, rank + 1)
    }

    /// A host file in MLX's ring format: each rank at its own address, rank 0 at a port free
    /// here whose next one is free too (its roster's), the others at 5000 in their own
    /// namespaces.
    pub fn host_file(&self, dir: &Path) -> PathBuf {
        let first = loop {
            let port = std::net::TcpListener::bind((self.address(0).as_str(), 0)).unwrap().local_addr().unwrap().port();
            if port < u16::MAX && std::net::TcpListener::bind((self.address(0).as_str(), port + 1)).is_ok() {
                break port;
            }
        };
        let ranks: Vec<Vec<String>> = (0..self.ranks)
            .map(|rank| vec![format!("{}:{}", self.address(rank), if rank == 0 { first } else { 5000 })])
            .collect();
        let path = dir.join(format!("lan-hosts-{}.json", self.ranks));
        std::fs::write(&path, serde_json::to_string(&ranks).unwrap()).unwrap();
        path
    }

    /// `program` to be run on rank `rank`'s machine (`ip netns exec` replaces itself with it,
    /// so the child's pid is the program's).
    pub fn command(&self, rank: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        if rank == 0 {
            return Command::new(program);
        }
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.namespace(rank)]).arg(program);
        command
    }

    /// Pulls rank `rank`'s cable out of the bridge: nothing crosses it either way.
    pub fn pull_cable(&self, rank: usize) {
        self.ip(&["link", "set", &self.cable(rank), "down"]);
    }

    pub fn plug_cable(&self, rank: usize) {
        self.ip(&["link", "set", &self.cable(rank), "up"]);
    }

    /// Cuts the link between ranks `a` and `b` (neither rank 0), both still reaching the
    /// others: each side's packets to the other find no route.
    pub fn cut_link(&self, a: usize, b: usize) {
        for (from, to) in [(a, b), (b, a)] {
            let to = format!("{}/32", self.address(to));
            self.ip(&["-n", &self.namespace(from), "route", "add", "unreachable", &to]);
        }
    }

    /// Mends what [`Self::cut_link`] cut.
    pub fn mend_link(&self, a: usize, b: usize) {
        for (from, to) in [(a, b), (b, a)] {
            let to = format!("{}/32", self.address(to));
            self.ip(&["-n", &self.namespace(from), "route", "del", "unreachable", &to]);
        }
    }

    fn bridge(&self) -> String {
        format!("{}b", self.name)
    }

    fn namespace(&self, rank: usize) -> String {
        format!("{}r{rank}", self.name)
    }

    /// The host's end of rank `rank`'s cable (the other end is `eth0` in its namespace).
    fn cable(&self, rank: usize) -> String {
        format!("{}v{rank}", self.name)
    }

    fn ip(&self, args: &[&str]) {
        let out = Command::new("ip").args(args).output().expect("iproute2's `ip` (scripts/setup.sh installs it)");
        assert!(
            out.status.success(),
            "ip {}: {} (a test network needs root)",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
}

/// A /24 of 198.18.0.0/15 that overlaps no route here (of any table), the search starting at
/// `seed`.
fn free_subnet(seed: u32) -> String {
    let out = Command::new("ip").args(["-4", "route", "show", "table", "all"]).output().expect("iproute2's `ip`");
    let routes: Vec<(u32, u32)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| prefix(line.split_whitespace().find(|w| w.starts_with(|c: char| c.is_ascii_digit()))?))
        .collect();
    let overlaps = |net: u32| {
        routes.iter().any(|&(other, len)| {
            let shorter = len.min(24);
            let mask = if shorter == 0 { 0 } else { u32::MAX << (32 - shorter) };
            net & mask == other & mask
        })
    };
    (0..512)
        .map(|k| (seed + k) % 512)
        .find(|&k| !overlaps(u32::from_be_bytes([198, 18 + (k / 256) as u8, (k % 256) as u8, 0])))
        .map(|k| format!("198.{}.{}", 18 + k / 256, k % 256))
        .expect("a free /24 in 198.18.0.0/15")
}

/// `a.b.c.d/len` (or a bare address, a /32) as its number and length.
fn prefix(text: &str) -> Option<(u32, u32)> {
    let (address, len) = text.split_once('/').unwrap_or((text, "32"));
    Some((u32::from(address.parse::<std::net::Ipv4Addr>().ok()?), len.parse().ok().filter(|&l| l <= 32)?))
}

/// Takes down the networks of test runs whose process is gone (killed before they could),
/// this process's own pid's included (a run before it had the same pid: this one has made
/// none yet).
fn sweep() {
    let gone = |name: &str| {
        test_network_pid(name).is_some_and(|p| p == std::process::id() || !Path::new(&format!("/proc/{p}")).exists())
    };
    let list = |args: &[&str]| {
        let out = Command::new("ip").args(args).output().map(|o| o.stdout).unwrap_or_default();
        String::from_utf8_lossy(&out).into_owned()
    };
    // `ip netns list`: "fx123n0r1 (id: 3)".
    for namespace in list(&["netns", "list"]).lines().filter_map(|l| l.split_whitespace().next()) {
        if gone(namespace) {
            let _ = Command::new("ip").args(["netns", "del", namespace]).output();
        }
    }
    // `ip -o link`: "7: fx123n0b: <...>", a cable "fx123n0v1@if2: ...".
    for line in list(&["-o", "link", "show"]).lines() {
        let name = line.split(": ").nth(1).and_then(|n| n.split('@').next()).unwrap_or_default();
        if gone(name) {
            let _ = Command::new("ip").args(["link", "del", name]).output();
        }
    }
}

/// The pid in a name this file gives (`fx<pid>n<n>` then `b`, `v<rank>` or `r<rank>`), or
/// `None` for any other name.
fn test_network_pid(name: &str) -> Option<u32> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (pid, rest) = name.strip_prefix("fx")?.split_once('n')?;
    let made_end = rest.find(|c: char| !c.is_ascii_digit())?;
    let (made, kind) = rest.split_at(made_end);
    let known = kind == "b" || kind.strip_prefix('v').or_else(|| kind.strip_prefix('r')).is_some_and(digits);
    (digits(pid) && digits(made) && known).then(|| pid.parse().ok()).flatten()
}

impl Drop for Lan {
    /// Each namespace's end of its cable goes with it, and the host's end with that.
    fn drop(&mut self) {
        for rank in 1..self.ranks {
            let _ = Command::new("ip").args(["netns", "del", &self.namespace(rank)]).output();
        }
        let _ = Command::new("ip").args(["link", "del", &self.bridge()]).output();
    }
}
