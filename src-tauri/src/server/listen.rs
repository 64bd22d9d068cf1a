//! The server's listening sockets, kept open across a restart of the process in place (rank 0
//! of `serve --cluster` starts itself again to rejoin its cluster): each socket has a second
//! descriptor kept here, which outlives the server that stops and is passed on to the new
//! process image, so the port never closes: connections made meanwhile wait in its queue
//! instead of being refused, and the new image serves them.

use std::net::IpAddr;

/// `host:port=fd` entries, `;`-separated: the sockets a restarted process takes over.
pub const INHERITED_VAR: &str = "FASTMLX_LISTEN_FDS";

fn key(host: IpAddr, port: u16) -> String {
    std::net::SocketAddr::new(host, port).to_string()
}

/// A socket's second descriptor, kept here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kept(i32);

/// Listens on `host:port`, taking over the socket a process restarted in place left open
/// (found by the address as asked, `port` 0 included).
pub async fn bind(host: IpAddr, port: u16) -> std::io::Result<(tokio::net::TcpListener, Kept)> {
    let key = key(host, port);
    let listener = match platform::inherited(&key) {
        Some(listener) => listener,
        None => tokio::net::TcpListener::bind((host, port)).await?,
    };
    let kept = platform::keep(&key, &listener)?;
    Ok((listener, Kept(kept)))
}

/// No longer listening there (the server stopped for good): the port closes.
pub fn closed(kept: Kept) {
    platform::forget(kept.0);
}

/// What a process restarting in place passes on: the environment entry and the descriptors
/// it must leave open.
/// The sockets the image before this one passed on (`FASTMLX_LISTEN_FDS`): each one's address
/// as asked for, and its descriptor.
#[cfg(unix)]
pub fn passed_on() -> Vec<(String, i32)> {
    parse_passed(&std::env::var(INHERITED_VAR).unwrap_or_default())
}

/// A `FASTMLX_LISTEN_FDS` entry (`address=fd;...`) read.
#[cfg(unix)]
fn parse_passed(entry: &str) -> Vec<(String, i32)> {
    let pair = |e: &str| e.rsplit_once('=').and_then(|(key, fd)| Some((key.to_string(), fd.parse().ok()?)));
    entry.split(';').filter_map(pair).collect()
}

pub fn to_pass_on() -> (String, Vec<i32>) {
    let kept = platform::kept();
    let entry = kept.iter().map(|(key, fd)| format!("{key}={fd}")).collect::<Vec<_>>().join(";");
    (entry, kept.into_iter().map(|(_, fd)| fd).collect())
}

#[cfg(unix)]
mod platform {
    use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
    use std::sync::Mutex;

    /// The second descriptor of each socket listening now, by the address asked for.
    static KEPT: Mutex<Vec<(String, OwnedFd)>> = Mutex::new(Vec::new());
    /// The addresses whose passed-on socket was taken: taken once (its descriptor's number may
    /// be another socket's later).
    static TAKEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

    pub fn keep(key: &str, listener: &tokio::net::TcpListener) -> std::io::Result<i32> {
        // A duplicate that closes on exec unless passed on.
        let second = listener.as_fd().try_clone_to_owned()?;
        let fd = second.as_raw_fd();
        KEPT.lock().unwrap_or_else(|e| e.into_inner()).push((key.to_string(), second));
        Ok(fd)
    }

    pub fn forget(fd: i32) {
        KEPT.lock().unwrap_or_else(|e| e.into_inner()).retain(|(_, kept)| kept.as_raw_fd() != fd);
    }

    pub fn kept() -> Vec<(String, i32)> {
        KEPT.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, fd)| (k.clone(), fd.as_raw_fd())).collect()
    }

    pub fn inherited(key: &str) -> Option<tokio::net::TcpListener> {
        {
            let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
            if taken.iter().any(|k| k == key) {
                return None;
            }
            taken.push(key.to_string());
        }
        let fd = super::passed_on().into_iter().find_map(|(k, fd)| (k == key).then_some(fd))?;
        // Only a listening socket is taken: the entry may be stale (set by hand, or its socket
        // closed before the restart).
        let mut accepting: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: a query into a local int; fails harmlessly on a descriptor that is no socket.
        let queried = unsafe {
            libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN, (&raw mut accepting).cast(), &mut len)
        };
        if queried != 0 || accepting == 0 {
            return None;
        }
        // SAFETY: the descriptor was left open for this process by the image it replaced, and
        // nothing else in this process owns it.
        let listener = unsafe { std::net::TcpListener::from_raw_fd(fd) };
        // SAFETY: flags of a descriptor this process owns: closed on the next exec.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        listener.set_nonblocking(true).ok()?;
        tokio::net::TcpListener::from_std(listener).ok()
    }
}

#[cfg(not(unix))]
mod platform {
    pub fn keep(_key: &str, _listener: &tokio::net::TcpListener) -> std::io::Result<i32> {
        Ok(-1)
    }
    pub fn forget(_fd: i32) {}
    pub fn kept() -> Vec<(String, i32)> {
        Vec::new()
    }
    pub fn inherited(_key: &str) -> Option<tokio::net::TcpListener> {
        None
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn the_passed_descriptors_are_read_from_the_entry() {
        let fds = |entry: &str| parse_passed(entry).into_iter().map(|(_, fd)| fd).collect::<Vec<_>>();
        assert_eq!(fds("127.0.0.1:8000=5;[::1]:8000=9"), [5, 9]);
        assert_eq!(parse_passed("[::1]:8000=9")[0].0, "[::1]:8000");
        assert_eq!(fds(""), Vec::<i32>::new());
        assert_eq!(fds("127.0.0.1:8000=x"), Vec::<i32>::new());
    }

    #[tokio::test]
    async fn the_port_stays_open_for_the_next_image_until_closed() {
        let host: IpAddr = "127.0.0.1".parse().unwrap();
        let (listener, kept) = bind(host, 0).await.unwrap();
        let address = listener.local_addr().unwrap();
        let (entry, keep) = to_pass_on();
        assert!(keep.contains(&kept.0) && entry.contains(&format!("127.0.0.1:0={}", kept.0)), "{entry}");
        // The server stops (its listener dropped): connections still queue on the kept one.
        drop(listener);
        assert!(std::net::TcpStream::connect(address).is_ok(), "the port closed with the server");
        closed(kept);
        assert!(std::net::TcpStream::connect(address).is_err(), "the port stayed open after closed()");
        assert!(!to_pass_on().1.contains(&kept.0));
    }
}
