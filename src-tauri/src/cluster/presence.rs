//! A worker's presence at rank 0 while the cluster forms and serves: its check-in's connection
//! to the roster held open, with a heartbeat. MLX tells rank 0 only that a wait on the ring
//! failed: on three ranks or more it hears from the ring's last rank alone, whose silence may be
//! any rank's loss, and a machine unplugged or asleep never closes its sockets, so the wait
//! lasts until its deadline. The presence connection says which machine is gone, and at once:
//! it closes without a goodbye when the worker's process ends, and its heartbeats stop when the
//! machine sleeps or its link goes. A worker that starts again or stops on its own says why
//! first, so that it is not taken for the machine that was lost.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::Duration;

/// How often a present worker says it is there.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// Silence after which rank 0 counts a present worker as gone (many heartbeats: a busy machine
/// still sends them, on a thread of their own).
pub const SILENCE: Duration = Duration::from_secs(10);
/// The longest line a present worker sends (a goodbye with its reason).
const MOST: u64 = 4096;

/// This process's presence, for its goodbye.
static PRESENT: Mutex<Option<Presence>> = Mutex::new(None);
/// What a worker does if rank 0 closes its presence before MLX has formed (rank 0 gave the
/// forming up): given why.
type OnClosed = Box<dyn Fn(String) + Send>;
static WHILE_FORMING: Mutex<Option<OnClosed>> = Mutex::new(None);

/// How a present worker's connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Departure {
    /// It said why (it starts again, or stops on its own).
    Left(String),
    /// Closed without a goodbye: its process ended, or its link went down.
    Closed,
    /// No heartbeat for [`SILENCE`]: asleep, stopped, or cut off.
    Silent,
}

impl Departure {
    /// Whether this is how a lost machine goes (not a worker that left on its own).
    pub fn unannounced(&self) -> bool {
        !matches!(self, Departure::Left(_))
    }

    /// What is said of the machine `name` that went this way.
    pub fn describe(&self, name: &str) -> String {
        match self {
            Departure::Left(why) => format!("{name} left: {why}"),
            Departure::Closed => format!(
                "{name} is gone: its connection to rank 0 closed without a goodbye (its process ended, or its link went down)"
            ),
            Departure::Silent => format!(
                "{name} is gone: not heard from for {} s (asleep, stopped, or cut off)",
                SILENCE.as_secs()
            ),
        }
    }
}

/// Worker, its check-in answered on `stream`: present at rank 0 from now on, until the
/// connection breaks (rank 0 gone: MLX's links say so too) or [`leave`] is called; the
/// connection, for what rank 0 says on it.
pub fn keep(stream: TcpStream) -> Option<TcpStream> {
    let heard = stream.try_clone().ok()?;
    let presence = Presence::start(stream)?;
    *PRESENT.lock().unwrap_or_else(|e| e.into_inner()) = Some(presence);
    Some(heard)
}

/// Worker: until [`formed`], rank 0 closing its presence connection calls `on_closed` (rather
/// than the worker waiting in MLX's connect or accept until its deadline).
pub fn while_forming(on_closed: impl Fn(String) + Send + 'static) {
    *WHILE_FORMING.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(on_closed));
}

/// Worker: MLX formed; a closed presence is MLX's links' business from now on.
pub fn formed() {
    WHILE_FORMING.lock().unwrap_or_else(|e| e.into_inner()).take();
}

/// Worker, told to form on `stream`: watches it for rank 0 closing it while MLX forms.
pub fn watch_while_forming(stream: TcpStream) {
    std::thread::spawn(move || {
        let _ = stream.set_read_timeout(None);
        // Rank 0 says nothing more after "form": any end is its going.
        let _ = (&stream).read(&mut [0u8; 64]);
        if let Some(on_closed) = &*WHILE_FORMING.lock().unwrap_or_else(|e| e.into_inner()) {
            on_closed("rank 0 closed its roster's connection while the cluster formed (it gave the forming up)".into());
        }
    });
}

/// Worker about to start again or stop (`why`): tells rank 0, if present there.
pub fn leave(why: &str) {
    // Its own goodbye closes the connection: not rank 0's going.
    formed();
    let presence = PRESENT.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(presence) = presence {
        presence.leave(why);
    }
}

/// A worker's presence connection.
struct Presence(TcpStream);

impl Presence {
    /// A heartbeat a second on `stream`, on a thread of its own, while the connection holds.
    fn start(stream: TcpStream) -> Option<Presence> {
        let _ = stream.set_nodelay(true);
        let _ = stream.set_write_timeout(Some(SILENCE));
        let goodbye = stream.try_clone().ok()?;
        std::thread::spawn(move || {
            while (&stream).write_all(b"\n").is_ok() {
                std::thread::sleep(HEARTBEAT);
            }
        });
        Some(Presence(goodbye))
    }

    /// Says why the worker goes, and closes the connection.
    fn leave(self, why: &str) {
        let said = why.replace(['\n', '\r'], " ");
        let mut line = format!("leaving {said}");
        let mut end = line.len().min(MOST as usize - 1);
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        line.truncate(end);
        line.push('\n');
        let _ = self.0.set_write_timeout(Some(Duration::from_secs(1)));
        let _ = (&self.0).write_all(line.as_bytes());
        let _ = self.0.shutdown(std::net::Shutdown::Both);
    }
}

/// Rank 0: reads a present worker's heartbeats on `stream` until it goes; how it went.
pub fn attend(stream: &TcpStream) -> Departure {
    attend_within(stream, SILENCE)
}

fn attend_within(stream: &TcpStream, silence: Duration) -> Departure {
    if stream.set_read_timeout(Some(silence)).is_err() {
        return Departure::Closed;
    }
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        match (&mut reader).take(MOST).read_line(&mut line) {
            Ok(0) => return Departure::Closed,
            Ok(_) => match line.trim_end().strip_prefix("leaving ") {
                Some(why) => return Departure::Left(why.to_string()),
                // A heartbeat (or a line cut at the limit: read on).
                None => continue,
            },
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return Departure::Silent,
            Err(_) => return Departure::Closed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A connected pair: (the worker's end, rank 0's end).
    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let worker = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        (worker, listener.accept().unwrap().0)
    }

    #[test]
    fn heartbeats_keep_a_worker_present_and_a_goodbye_says_why() {
        let (worker, rank0) = pair();
        let reading = std::thread::spawn(move || attend_within(&rank0, Duration::from_millis(1500)));
        let presence = Presence::start(worker).unwrap();
        // Past the silence limit, kept present by the heartbeats.
        std::thread::sleep(Duration::from_millis(2500));
        assert!(!reading.is_finished());
        presence.leave("rank 1: the cluster lost a rank\nwaiting for rank 2");
        let went = reading.join().unwrap();
        assert_eq!(went, Departure::Left("rank 1: the cluster lost a rank waiting for rank 2".into()));
        assert!(!went.unannounced());
    }

    #[test]
    fn a_worker_that_ends_or_falls_silent_is_gone_unannounced() {
        let (worker, rank0) = pair();
        let reading = std::thread::spawn(move || attend_within(&rank0, Duration::from_secs(5)));
        (&worker).write_all(b"\n\n").unwrap();
        drop(worker);
        let went = reading.join().unwrap();
        assert_eq!(went, Departure::Closed);
        assert!(went.unannounced() && went.describe("rank 2 (h:1)").contains("rank 2 (h:1) is gone"));
        // Connected, never heard from again.
        let (_worker, rank0) = pair();
        let started = std::time::Instant::now();
        assert_eq!(attend_within(&rank0, Duration::from_millis(300)), Departure::Silent);
        assert!(started.elapsed() >= Duration::from_millis(300));
    }
}
