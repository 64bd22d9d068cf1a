//! A deadline on every wait for another rank. MLX cannot be interrupted while it waits on a
//! peer (a machine switched off or unplugged may never close the connection), so a wait past
//! its deadline ends the process with an error naming what it waited for, never a hang; or,
//! in a server that must stay up (rank 0 of `serve --cluster`), is handed to what the server
//! does instead (`on_expiry`), and the waiting thread is left to MLX.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type Armed = Arc<Mutex<Option<(Instant, String)>>>;
/// What a wait past its deadline does instead of ending the process: given the error.
type OnExpiry = Arc<Mutex<Option<Box<dyn Fn(String) + Send>>>>;

/// Watches one process's waits on its peers.
#[derive(Clone)]
pub struct Watchdog {
    armed: Armed,
    on_expiry: OnExpiry,
    timeout: Duration,
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
        let on_expiry: OnExpiry = Arc::new(Mutex::new(None));
        let (watched, hook) = (armed.clone(), on_expiry.clone());
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(100));
            let expired = {
                let mut armed = watched.lock().unwrap_or_else(|e| e.into_inner());
                match &*armed {
                    // Told once: the wait it describes is given up.
                    Some((since, what)) if since.elapsed() > timeout => armed.take().map(|(_, what)| what),
                    _ => None,
                }
            };
            let Some(what) = expired else { continue };
            let error = format!(
                "rank {rank}: {what} for over {} s: is that machine still running and reachable?",
                timeout.as_secs()
            );
            match &*hook.lock().unwrap_or_else(|e| e.into_inner()) {
                Some(on_expiry) => on_expiry(error),
                None => {
                    eprintln!("error: {error}");
                    std::process::exit(1);
                }
            }
        });
        Watchdog { armed, on_expiry, timeout }
    }

    /// How long a wait may last.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A wait past its deadline calls `on_expiry` with the error instead of ending the process.
    pub fn on_expiry(&self, on_expiry: impl Fn(String) + Send + 'static) {
        *self.on_expiry.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(on_expiry));
    }

    /// Watches a wait described by `what` ("waiting for rank 1") until the guard is dropped.
    pub fn waiting(&self, what: impl Into<String>) -> Waiting {
        *self.armed.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), what.into()));
        Waiting { armed: self.armed.clone() }
    }
}
