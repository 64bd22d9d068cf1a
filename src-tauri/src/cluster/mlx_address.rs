//! A rank's MLX addresses before the cluster forms. Once MLX's `init` has started, a rank that
//! cannot listen fails it without saying which rank it was, and a rank that cannot reach its
//! neighbour says only "Couldn't connect" (after minutes, where a firewall drops the
//! connection), so the cluster would start again and again without a name. So while a machine
//! waits to form, it holds its addresses itself ([`hold`]: a rank that cannot is named with the
//! reason, another process holding the port or the address not this machine's), answering each
//! connection with [`HELLO`], and its left neighbour in the ring checks that it reaches them
//! ([`reach`]), along the very path MLX will connect on.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What a held address answers: a FastMLX rank waiting to form.
const HELLO: &[u8] = b"fastmlx rank waiting to form\n";

/// A machine's MLX addresses, held (and answering probes) until dropped, when MLX may bind them.
pub struct Held {
    stop: Arc<AtomicBool>,
    /// Each listener's address and the thread answering there.
    threads: Vec<(std::net::SocketAddr, std::thread::JoinHandle<()>)>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for (mut at, thread) in self.threads.drain(..) {
            // A connection of its own wakes the thread from its accept; it then ends, and the
            // listener with it. One that cannot be made (a rule against it) leaves the thread
            // behind rather than wait for ever: its listener goes with the process.
            if at.ip().is_unspecified() {
                at.set_ip(if at.is_ipv4() { Ipv4Addr::LOCALHOST.into() } else { Ipv6Addr::LOCALHOST.into() });
            }
            if TcpStream::connect_timeout(&at, Duration::from_secs(1)).is_ok() {
                let _ = thread.join();
            }
        }
    }
}

/// Holds `addresses` (a rank's list in the host file), or says why MLX could not listen there.
/// A port another process listens on counts as taken even where that process let others share
/// it (MLX's own sockets do): the ring's peers would reach that process, not this one.
pub fn hold(addresses: &[String]) -> Result<Held, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut held = Held { stop: stop.clone(), threads: Vec::new() };
    for address in addresses {
        let listener = listen(address).map_err(|e| format!("MLX cannot listen at {address}: {e}"))?;
        let at = listener.local_addr().map_err(|e| format!("MLX cannot listen at {address}: {e}"))?;
        let stop = stop.clone();
        held.threads.push((at, std::thread::spawn(move || answer_probes(&listener, &stop))));
    }
    Ok(held)
}

/// Binds a listener at `address` (each address it resolves to, until one binds). The
/// standard library sets SO_REUSEADDR on Unix, as MLX does: a port left in TIME_WAIT by a
/// rank's earlier process is free.
fn listen(address: &str) -> std::io::Result<TcpListener> {
    let mut last = std::io::Error::new(std::io::ErrorKind::AddrNotAvailable, "no address resolved");
    for at in address.to_socket_addrs()? {
        match TcpListener::bind(at) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Each connection answered with [`HELLO`] until `stop` (a blocking accept: a machine may
/// wait hours to form, on battery); the prober closes first, so the closed connections'
/// TIME_WAIT stays on its side (that of the connection that wakes it at the end stays here,
/// which SO_REUSEADDR lets MLX bind past).
fn answer_probes(listener: &TcpListener, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) if !stop.load(Ordering::SeqCst) => {
                let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
                let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
                let _ = (&stream).write_all(HELLO);
                let _ = (&stream).read(&mut [0u8; 1]);
            }
            Ok(_) => return,
            // Out of descriptors, say: a pause rather than a spin.
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Whether this machine reaches a neighbour's held `addresses` within `within` each: the
/// first that does not, and why.
pub fn reach(addresses: &[String], within: Duration) -> Result<(), String> {
    for address in addresses {
        reach_one(address, within).map_err(|e| format!("cannot reach {address}: {e}"))?;
    }
    Ok(())
}

fn reach_one(address: &str, within: Duration) -> Result<(), String> {
    let at = address.to_socket_addrs().map_err(|e| e.to_string())?.next().ok_or("it resolves to nothing")?;
    let stream = TcpStream::connect_timeout(&at, within).map_err(|e| match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
            format!("no answer in {} s (a firewall there, or no route?)", within.as_secs_f32())
        }
        _ => e.to_string(),
    })?;
    stream.set_read_timeout(Some(within)).map_err(|e| e.to_string())?;
    let mut said = vec![0u8; HELLO.len()];
    match (&stream).read_exact(&mut said) {
        Ok(()) if said == HELLO => Ok(()),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock) => {
            Err(format!("connected, but no greeting in {} s", within.as_secs_f32()))
        }
        _ => Err("something answers there, but not a FastMLX rank waiting to form".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Why MLX could not listen at `addresses`, if it could not (held a moment and let go).
    fn problem(addresses: &[String]) -> Option<String> {
        hold(addresses).err()
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    #[test]
    fn a_port_held_or_an_address_of_another_machine_is_named() {
        let port = free_port();
        assert_eq!(problem(&[format!("127.0.0.1:{port}")]), None);
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken = held.local_addr().unwrap().to_string();
        let why = problem(&[format!("127.0.0.1:{port}"), taken.clone()]).expect("the port is held");
        assert!(why.starts_with(&format!("MLX cannot listen at {taken}: ")), "{why}");
        // TEST-NET-3: an address no interface of this machine has.
        let why = problem(&["203.0.113.7:5000".to_string()]).expect("not this machine's address");
        assert!(why.starts_with("MLX cannot listen at 203.0.113.7:5000: "), "{why}");
        assert!(problem(&["not an address".to_string()]).is_some());
    }

    #[test]
    fn a_held_address_is_reached_and_freed_for_mlx_once_let_go() {
        let address = format!("127.0.0.1:{}", free_port());
        let held = hold(std::slice::from_ref(&address)).unwrap();
        let within = Duration::from_secs(1);
        // Reached, again and again, and held against another bind meanwhile.
        for _ in 0..3 {
            assert_eq!(reach(std::slice::from_ref(&address), within), Ok(()));
        }
        assert!(problem(std::slice::from_ref(&address)).is_some());
        drop(held);
        // Let go: MLX binds it (its sockets share ports; a plain bind is the stricter check).
        assert_eq!(problem(std::slice::from_ref(&address)), None);
        let why = reach(std::slice::from_ref(&address), within).unwrap_err();
        assert!(why.starts_with(&format!("cannot reach {address}: ")), "{why}");
        // Another program at the address: reached, but not a rank.
        let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = other.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (stream, _) = other.accept().unwrap();
            (&stream).write_all(b"SSH-2.0-OpenSSH_9.6 and more than enough\n").unwrap();
            std::thread::sleep(Duration::from_secs(2));
        });
        let why = reach(&[at], within).unwrap_err();
        assert!(why.contains("not a FastMLX rank"), "{why}");
    }
}
