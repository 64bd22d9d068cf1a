//! A worker's presence at rank 0 while the cluster forms and serves: its check-in's connection
//! to the roster held open, with a heartbeat. MLX tells rank 0 only that a wait on the ring
//! failed: on three ranks or more it hears from the ring's last rank alone, whose silence may be
//! any rank's loss, and a machine unplugged or asleep never closes its sockets, so the wait
//! lasts until its deadline. The presence connection says which machine is gone, and at once:
//! it closes without a goodbye when the worker's process ends, and its heartbeats stop when the
//! machine sleeps or its link goes. A worker that starts again or stops on its own says why
//! first, so that it is not taken for the machine that was lost. Each heartbeat also says
//! whether the worker still reaches its right neighbour's link post ([`super::link_watch`]).

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use super::link_watch::{Post, Watch};

/// How often a present worker says it is there.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// Silence after which rank 0 counts a present worker as gone (many heartbeats: a busy machine
/// still sends them, on a thread of their own).
pub const SILENCE: Duration = Duration::from_secs(10);
/// The longest line a present worker sends (a goodbye with its reason).
const MOST: u64 = 4096;

/// How long a worker of a formed cluster gives its own steps once rank 0 closed its presence
/// (rank 0 stopping tells the workers so on MLX's links as it goes) before it starts again.
const AFTER_RANK_0: Duration = Duration::from_secs(2);

/// This process's presence, for its goodbye.
static PRESENT: Mutex<Option<Presence>> = Mutex::new(None);
/// What a worker does once rank 0 closes its presence (rank 0 gave the forming up, started
/// again or is gone): given why.
type OnClosed = Box<dyn Fn(String) + Send>;
static ON_RANK_0_GONE: Mutex<Option<OnClosed>> = Mutex::new(None);
/// Whether MLX has formed: a closed presence then waits [`AFTER_RANK_0`].
static FORMED: AtomicBool = AtomicBool::new(false);
/// Why this worker no longer reaches its right neighbour's link post, told with each heartbeat.
static LINK_DOWN: Mutex<Option<String>> = Mutex::new(None);
/// This worker's link post and its watch of its neighbour's, kept while the process serves.
static LINKS: Mutex<(Option<Post>, Option<Watch>)> = Mutex::new((None, None));

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

/// Worker: rank 0 closing its presence connection calls `on_gone`: at once while MLX forms
/// (rather than wait in MLX's connect or accept until its deadline), [`AFTER_RANK_0`] later
/// once formed (rather than wait on a neighbour that still holds its link open).
pub fn on_rank_0_gone(on_gone: impl Fn(String) + Send + 'static) {
    *ON_RANK_0_GONE.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(on_gone));
}

/// Worker: MLX formed.
pub fn formed() {
    FORMED.store(true, Ordering::SeqCst);
}

/// Worker, told to form on `stream`: watches it for rank 0 waking this worker from a park
/// ([`wait_for_wake`]) and for rank 0 closing it.
pub fn watch_rank_0(stream: TcpStream) {
    std::thread::spawn(move || {
        let _ = stream.set_read_timeout(None);
        // After "form" rank 0 says only "wake N": any other end is its going.
        let mut reader = BufReader::new(&stream);
        let mut line = String::new();
        while matches!((&mut reader).take(MOST).read_line(&mut line), Ok(n) if n > 0) {
            if let Some(park) = line.trim().strip_prefix(super::roster::WAKE).and_then(|n| n.trim().parse().ok()) {
                woken(park);
            }
            line.clear();
        }
        let why = match FORMED.load(Ordering::SeqCst) {
            false => "rank 0 closed its roster's connection while the cluster formed (it gave the forming up)",
            true => {
                std::thread::sleep(AFTER_RANK_0);
                "rank 0 closed its roster's connection (it started again, or is gone)"
            }
        };
        rank_0_gone(why.into());
    });
}

/// The last park rank 0 woke this worker from.
static WOKEN: (Mutex<u64>, Condvar) = (Mutex::new(0), Condvar::new());

fn woken(park: u64) {
    let mut last = WOKEN.0.lock().unwrap_or_else(|e| e.into_inner());
    *last = (*last).max(park);
    WOKEN.1.notify_all();
}

/// Worker parked by rank 0 (`park`, the park's number): whether rank 0 woke it `within` that
/// long (for its next step or its heartbeat). Parked, the worker waits on no MLX link, whose
/// wait spins a core; rank 0 closing the connection ends the process meanwhile
/// ([`on_rank_0_gone`]), and rank 0 silent past `within` is as a wait past its deadline.
pub fn wait_for_wake(park: u64, within: Duration) -> bool {
    let last = WOKEN.0.lock().unwrap_or_else(|e| e.into_inner());
    let woken = WOKEN.1.wait_timeout_while(last, within, |last| *last < park);
    let (last, _) = woken.unwrap_or_else(|e| e.into_inner());
    *last >= park
}

/// Runs what a worker does once rank 0 is gone, if it still has that to do.
fn rank_0_gone(why: String) {
    // Taken out first: what it does (a restart) says goodbye, which takes the lock.
    let on_gone = ON_RANK_0_GONE.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(on_gone) = on_gone {
        on_gone(why);
    }
}

/// Worker: keeps its link post (its left neighbour probes it) and watches its right
/// neighbour's at `target` (none where rank 0 had no post to give), telling rank 0 with each
/// heartbeat whether it reaches it.
pub fn watch_links(post: Option<Post>, target: Option<String>) {
    let watch = target.map(|target| {
        Watch::start(target, |change| {
            match &change {
                Some(why) => eprintln!("the link to the next machine is down: {why}"),
                None => eprintln!("the link to the next machine is back"),
            }
            *LINK_DOWN.lock().unwrap_or_else(|e| e.into_inner()) = change;
        })
    });
    *LINKS.lock().unwrap_or_else(|e| e.into_inner()) = (post, watch);
}

/// Worker told by rank 0 to stop: rank 0's going is no reason to start again from now on
/// (the goodbye, [`leave`], follows once its part of the model is let go).
pub fn stopping() {
    ON_RANK_0_GONE.lock().unwrap_or_else(|e| e.into_inner()).take();
}

/// Worker about to start again or stop (`why`): tells rank 0, if present there.
pub fn leave(why: &str) {
    // Its own goodbye closes the connection: not rank 0's going.
    ON_RANK_0_GONE.lock().unwrap_or_else(|e| e.into_inner()).take();
    step_back(why);
}

/// Worker whose presence failed before it was told to form (`why`): tells rank 0, and checks
/// in again as before (still to follow rank 0 once it forms).
pub fn step_back(why: &str) {
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
        std::thread::spawn(move || loop {
            let line = heartbeat(&LINK_DOWN.lock().unwrap_or_else(|e| e.into_inner()));
            if (&stream).write_all(line.as_bytes()).is_err() {
                return;
            }
            std::thread::sleep(HEARTBEAT);
        });
        Some(Presence(goodbye))
    }

    /// Says why the worker goes, and closes the connection.
    fn leave(self, why: &str) {
        let line = format!("leaving {}\n", one_line(why, MOST as usize - 10));
        let _ = self.0.set_write_timeout(Some(Duration::from_secs(1)));
        let _ = (&self.0).write_all(line.as_bytes());
        let _ = self.0.shutdown(std::net::Shutdown::Both);
    }
}

/// A heartbeat, saying why the link to the right neighbour is down if it is.
fn heartbeat(link_down: &Option<String>) -> String {
    match link_down {
        Some(why) => format!("down {}\n", one_line(why, 512)),
        None => "\n".into(),
    }
}

/// `text` on one line, cut to at most `most` bytes.
fn one_line(text: &str, most: usize) -> String {
    let mut line = text.replace(['\n', '\r'], " ");
    let mut end = line.len().min(most);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    line.truncate(end);
    line
}

/// Rank 0: reads a present worker's heartbeats on `stream` until it goes; how it went. Each
/// heartbeat's word on the worker's link to its right neighbour goes to `on_link`: why it is
/// down, or `None` (it reaches it).
pub fn attend(stream: &TcpStream, on_link: impl FnMut(Option<String>)) -> Departure {
    attend_within(stream, SILENCE, on_link)
}

fn attend_within(stream: &TcpStream, silence: Duration, mut on_link: impl FnMut(Option<String>)) -> Departure {
    if stream.set_read_timeout(Some(silence)).is_err() {
        return Departure::Closed;
    }
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        match (&mut reader).take(MOST).read_line(&mut line) {
            Ok(0) => return Departure::Closed,
            Ok(_) => {
                let line = line.trim_end();
                if let Some(why) = line.strip_prefix("leaving ") {
                    return Departure::Left(why.to_string());
                }
                // A heartbeat (a line cut at the limit read as one).
                on_link(line.strip_prefix("down ").map(str::to_string));
            }
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
        let reading = std::thread::spawn(move || attend_within(&rank0, Duration::from_millis(1500), |_| {}));
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
    fn rank_0_gone_runs_a_restart_that_says_goodbye_once() {
        // A restart says goodbye ([`leave`]), on the thread that found rank 0 gone.
        let (told, heard) = std::sync::mpsc::channel();
        on_rank_0_gone(move |why| {
            leave("starting again");
            told.send(why).unwrap();
        });
        std::thread::spawn(|| rank_0_gone("rank 0 is gone".into()));
        assert_eq!(heard.recv_timeout(Duration::from_secs(2)).unwrap(), "rank 0 is gone");
        // Done once: a second end finds nothing to do.
        rank_0_gone("again".into());
        assert!(heard.recv_timeout(Duration::from_millis(200)).is_err());
    }

    #[test]
    fn a_worker_that_ends_or_falls_silent_is_gone_unannounced() {
        let (worker, rank0) = pair();
        let reading = std::thread::spawn(move || {
            let mut heard = Vec::new();
            (attend_within(&rank0, Duration::from_secs(5), |link| heard.push(link)), heard)
        });
        let beats = [heartbeat(&None), heartbeat(&Some("cannot reach h:2\nrefused".into()))];
        (&worker).write_all(beats.concat().as_bytes()).unwrap();
        drop(worker);
        let (went, heard) = reading.join().unwrap();
        assert_eq!(went, Departure::Closed);
        // Each heartbeat says whether its link is down, and why, on one line.
        assert_eq!(heard, [None, Some("cannot reach h:2 refused".to_string())]);
        assert!(went.unannounced() && went.describe("rank 2 (h:1)").contains("rank 2 (h:1) is gone"));
        // Connected, never heard from again.
        let (_worker, rank0) = pair();
        let started = std::time::Instant::now();
        assert_eq!(attend_within(&rank0, Duration::from_millis(300), |_| {}), Departure::Silent);
        assert!(started.elapsed() >= Duration::from_millis(300));
    }
}
