//! Whether MLX will be able to listen at a rank's addresses in the host file, checked before the
//! cluster forms: once MLX's `init` has started, a rank that cannot listen fails it without
//! saying which rank it was, and the cluster would start again and again. Checked here, the rank
//! is named with the reason (another process holds the port, or the address is not this
//! machine's) and the cluster waits for it.

use std::net::ToSocketAddrs;

/// Why MLX could not listen at `addresses` (a rank's list in the host file), if it could not.
/// A port another process listens on counts as taken even where that process let others share
/// it (MLX's own sockets do): the ring's peers would reach that process, not this one.
pub fn problem(addresses: &[String]) -> Option<String> {
    addresses
        .iter()
        .find_map(|address| listenable(address).err().map(|e| format!("MLX cannot listen at {address}: {e}")))
}

/// Binds a socket at `address` (each address it resolves to, until one binds) and lets it go.
fn listenable(address: &str) -> std::io::Result<()> {
    let mut last = std::io::Error::new(std::io::ErrorKind::AddrNotAvailable, "no address resolved");
    for at in address.to_socket_addrs()? {
        let socket = match at {
            std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        // A port left in TIME_WAIT by a rank's earlier process is free, as it is for MLX.
        socket.set_reuseaddr(true)?;
        match socket.bind(at) {
            Ok(()) => return Ok(()),
            Err(e) => last = e,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::problem;

    #[test]
    fn a_port_held_or_an_address_of_another_machine_is_named() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
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
}
