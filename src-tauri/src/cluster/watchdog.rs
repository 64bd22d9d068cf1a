//! A deadline on every wait for another rank. MLX cannot be interrupted while it waits on a
//! peer (a machine switched off or unplugged may never close the connection), so a wait past
//! its deadline ends the process with an error naming what it waited for, never a hang.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type Armed = Arc<Mutex<Option<(Instant, String)>>>;

/// Watches one process's waits on its peers.
#[derive(Clone)]
pub struct Watchdog {
    armed: Armed,
}

/// While held, a wait is watched; dropping it ends the watch.
pub struct Waiting {
    armed: Armed,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        *self.armed.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

impl Watchdog {
    /// Starts watching (a thread that wakes every 100 ms); `rank` names this process in the error.
    pub fn start(rank: usize, timeout: Duration) -> Watchdog {
        let armed: Armed = Arc::new(Mutex::new(None));
        let watched = armed.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(100));
            let expired = match &*watched.lock().unwrap_or_else(|e| e.into_inner()) {
                Some((since, what)) if since.elapsed() > timeout => Some(what.clone()),
                _ => None,
            };
            if let Some(what) = expired {
                eprintln!(
                    "error: rank {rank}: {what} for over {} s: is that machine still running and reachable?",
                    timeout.as_secs()
                );
                std::process::exit(1);
            }
        });
        Watchdog { armed }
    }

    /// Watches a wait described by `what` ("waiting for rank 1") until the guard is dropped.
    pub fn waiting(&self, what: impl Into<String>) -> Waiting {
        *self.armed.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), what.into()));
        Waiting { armed: self.armed.clone() }
    }
}
