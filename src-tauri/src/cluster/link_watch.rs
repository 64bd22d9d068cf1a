//! MLX's links watched while the cluster serves. A link that breaks between two machines that
//! both stay up (a cable pulled in a ring of three, a Thunderbolt bridge gone down while the
//! roster's connections run over Wi-Fi) closes nothing: MLX's wait on it lasts until its
//! deadline and then names no machine, and every machine is still present at rank 0. So each
//! machine of a formed cluster keeps a [`Post`], a listener of its own on the address MLX uses,
//! and its left neighbour in the ring connects to it once a second ([`Watch`]): the link is down
//! once that fails [`FAILURES`] times in a row, and rank 0 is told which link it is.
//!
//! A post is a port of its own, not MLX's: MLX's ring no longer listens once formed, and a
//! closed port may go unanswered (macOS's stealth mode), which would read as a link down. The
//! kernel completes a probe's connection whatever the process is busy with, so a machine deep
//! in a long step still answers.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a link is probed.
const EVERY: Duration = Duration::from_secs(1);
/// How long one probe may take.
const WITHIN: Duration = Duration::from_secs(1);
/// Probes failed in a row before the link counts as down (one lost SYN is not a pulled cable).
pub const FAILURES: u32 = 3;

/// A machine's post: a listener on the host of its first MLX address, at a port of the
/// system's choosing, that its left neighbour connects to; closed when dropped.
pub struct Post {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl Post {
    /// Opens a post beside `mlx_address` (`host:port`, MLX's address of this machine).
    pub fn open(mlx_address: &str) -> Result<Post, String> {
        let host = host_of(mlx_address).ok_or_else(|| format!("{mlx_address} is not host:port"))?;
        let listener =
            TcpListener::bind((host.as_str(), 0)).map_err(|e| format!("cannot listen beside {mlx_address}: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::Builder::new()
            .name("fastmlx-link-post".into())
            .spawn(move || answer(listener, &stopped))
            .map_err(|e| e.to_string())?;
        Ok(Post { port, stop })
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for Post {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Takes the probes' connections off the queue (the kernel has already completed them: that is
/// the probe's answer) and closes them, until stopped. Polled rather than blocked on, so that
/// dropping the post closes the listener within a tick.
fn answer(listener: TcpListener, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        while let Ok((stream, _)) = listener.accept() {
            drop(stream);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Where a post opened beside `mlx_address` at `port` is reached: that host (the loopback for
/// an unspecified one, which only a single machine's test file uses).
pub fn address(mlx_address: &str, port: u16) -> Option<String> {
    let host = host_of(mlx_address)?;
    let host = match host.parse::<std::net::IpAddr>() {
        Ok(ip) if ip.is_unspecified() && ip.is_ipv4() => Ipv4Addr::LOCALHOST.to_string(),
        Ok(ip) if ip.is_unspecified() => format!("[{}]", Ipv6Addr::LOCALHOST),
        Ok(std::net::IpAddr::V6(ip)) => format!("[{ip}]"),
        _ => host,
    };
    Some(format!("{host}:{port}"))
}

/// The host of `host:port` (brackets of an IPv6 address taken off).
fn host_of(address: &str) -> Option<String> {
    let (host, _) = address.rsplit_once(':')?;
    Some(host.trim_start_matches('[').trim_end_matches(']').to_string())
}

/// A neighbour's post probed once a second, on a thread of its own, until dropped.
pub struct Watch {
    stop: Arc<AtomicBool>,
}

impl Watch {
    /// Probes `target` (a post's [`address`]); `on_change` is told when the link goes down (why)
    /// and when it is back (`None`), not on every probe.
    pub fn start(target: String, on_change: impl Fn(Option<String>) + Send + 'static) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let watched = target.clone();
        let spawned = std::thread::Builder::new()
            .name("fastmlx-link-watch".into())
            .spawn(move || watch(&watched, &stopped, on_change));
        if let Err(e) = spawned {
            eprintln!("the link to {target} is not watched: {e}");
        }
        Watch { stop }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Probes `target` until `stop`. Only a link reached once can go down: a post never reached
/// (a firewall that lets MLX's ports through and no other, an address the neighbour cannot
/// use) leaves the link unwatched, as said, rather than fail a cluster that MLX serves on.
fn watch(target: &str, stop: &AtomicBool, on_change: impl Fn(Option<String>)) {
    let (mut failed, mut down, mut reached, mut said) = (0u32, false, false, false);
    let started = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        let probed = Instant::now();
        match probe(target) {
            Probe::Reached => {
                (failed, reached) = (0, true);
                if std::mem::take(&mut down) {
                    on_change(None);
                }
            }
            Probe::Failed(why) if reached => {
                failed += 1;
                if failed >= FAILURES && !down && !stop.load(Ordering::SeqCst) {
                    down = true;
                    on_change(Some(format!("{why} ({failed} probes in a row)")));
                }
            }
            Probe::Failed(why) | Probe::NotTold(why) => {
                if !reached && !said && started.elapsed() > UNWATCHED_AFTER {
                    eprintln!("the link to {target} goes unwatched until it is reached: {why}");
                    said = true;
                }
            }
        }
        std::thread::sleep(EVERY.saturating_sub(probed.elapsed()));
    }
}

/// How long a post may go unreached from the start before that is said.
const UNWATCHED_AFTER: Duration = Duration::from_secs(10);

/// What one probe says of the link.
enum Probe {
    Reached,
    /// The network's answer: no route, refused, no answer.
    Failed(String),
    /// This machine's own trouble (out of descriptors, a name that does not resolve): it says
    /// nothing of the link.
    NotTold(String),
}

/// One probe: a connection made to `target` within [`WITHIN`], or why not.
fn probe(target: &str) -> Probe {
    let at: Option<SocketAddr> = target.to_socket_addrs().ok().and_then(|mut a| a.next());
    let Some(at) = at else { return Probe::NotTold(format!("{target} does not resolve")) };
    match TcpStream::connect_timeout(&at, WITHIN) {
        Ok(_) => Probe::Reached,
        Err(e) if own_trouble(&e) => Probe::NotTold(format!("cannot probe {target}: {e}")),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock) => {
            Probe::Failed(format!("cannot reach {target}: no answer in {} s", WITHIN.as_secs_f32()))
        }
        // Refused, no route, host down (macOS's answer while it cannot find a neighbour's
        // hardware address), the address gone: the network's word on the link.
        Err(e) => Probe::Failed(format!("cannot reach {target}: {e}")),
    }
}

/// Whether a failed connect is this machine's own trouble (out of descriptors, buffers or
/// memory), which says nothing of the link.
fn own_trouble(error: &std::io::Error) -> bool {
    #[cfg(unix)]
    {
        matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
    }
    #[cfg(not(unix))]
    {
        let _ = error;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn a_post_is_found_beside_the_mlx_address_and_its_link_watched_until_it_closes() {
        assert_eq!(address("0.0.0.0:5000", 7), Some("127.0.0.1:7".into()));
        assert_eq!(address("[::1]:5000", 7), Some("[::1]:7".into()));
        assert_eq!(address("10.0.0.2:5000", 7), Some("10.0.0.2:7".into()));
        assert_eq!(address("no port", 7), None);

        let post = Post::open("127.0.0.1:5000").unwrap();
        let (told, heard) = mpsc::channel();
        let target = address("127.0.0.1:5000", post.port()).unwrap();
        let _watch = Watch::start(target.clone(), move |change| told.send(change).unwrap());
        // Up: nothing said, however long.
        assert!(heard.recv_timeout(Duration::from_millis(2500)).is_err());
        // Closed: down once it failed three times (refused, each at once), said once.
        let closed = Instant::now();
        drop(post);
        let down = heard.recv_timeout(Duration::from_secs(6)).unwrap().expect("down");
        assert!(closed.elapsed() >= Duration::from_secs(2), "{:?}", closed.elapsed());
        assert!(
            down.starts_with(&format!("cannot reach {target}: ")) && down.ends_with("(3 probes in a row)"),
            "{down}"
        );
        assert!(heard.recv_timeout(Duration::from_millis(1500)).is_err(), "said once");
        // Open again at the same port: back.
        let again = TcpListener::bind(target.as_str()).unwrap();
        assert_eq!(heard.recv_timeout(Duration::from_secs(3)).unwrap(), None);
        drop(again);
    }

    #[test]
    fn a_post_never_reached_leaves_its_link_unwatched_rather_than_down() {
        let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
        let (told, heard) = mpsc::channel();
        let _watch = Watch::start(closed, move |change| told.send(change).unwrap());
        assert!(heard.recv_timeout(Duration::from_millis(4500)).is_err(), "a link never reached went down");
    }
}
