//! Running the API on a socket, stoppable: `fastmlx serve` runs one until a signal, the
//! desktop app starts and stops one from its menu.

use std::net::{IpAddr, SocketAddr};

use tokio::sync::watch;

use super::{app, AppState, ServerConfig};
use crate::store::{Pulls, Residency};

pub struct RunningServer {
    pub address: SocketAddr,
    /// The second address, on Ollama's port, when `ollama_port` is set.
    pub ollama_address: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<std::io::Result<()>>>,
    /// Its sockets' second descriptors (`listen`), closed with it.
    bound: Vec<super::listen::Kept>,
}

impl RunningServer {
    /// Binds `host:port` (0: any free port), and `host:ollama_port` when configured, and serves
    /// until [`RunningServer::stop`].
    pub async fn start(
        models: Residency,
        pulls: Pulls,
        mut config: ServerConfig,
        host: IpAddr,
        port: u16,
    ) -> std::io::Result<RunningServer> {
        let (listener, main) = super::listen::bind(host, port).await?;
        let address = listener.local_addr()?;
        let mut bound = vec![main];
        let ollama = match config.ollama_port {
            Some(p) => match super::listen::bind(host, p).await {
                Ok((listener, kept)) => {
                    bound.push(kept);
                    Some(listener)
                }
                Err(e) => {
                    super::listen::closed(bound[0]);
                    return Err(std::io::Error::new(e.kind(), format!("the Ollama port {p}: {e}")));
                }
            },
            None => None,
        };
        let ollama_address = ollama.as_ref().map(|l| l.local_addr()).transpose()?;
        config.listen = Some(address);
        let state = AppState::from_parts(models, pulls, config);
        let (stop, stopped) = watch::channel(false);
        let serve = |listener: tokio::net::TcpListener| {
            let mut stopped = stopped.clone();
            let router = app(state.clone());
            tokio::spawn(async move {
                axum::serve(listener, router)
                    .with_graceful_shutdown(async move {
                        let _ = stopped.wait_for(|s| *s).await;
                    })
                    .await
            })
        };
        let mut tasks = vec![serve(listener)];
        tasks.extend(ollama.map(serve));
        tasks.push(tokio::spawn(super::live::record(state.clone(), stopped.clone())));
        Ok(RunningServer { address, ollama_address, stop, tasks, bound })
    }

    /// The OpenAI base URL.
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.address)
    }

    /// Stops listening and waits for open connections to finish (streams end when their
    /// engines do: unload the models first to cut them short).
    pub async fn stop(mut self) -> std::io::Result<()> {
        for kept in std::mem::take(&mut self.bound) {
            super::listen::closed(kept);
        }
        let _ = self.stop.send(true);
        for task in std::mem::take(&mut self.tasks) {
            task.await.unwrap_or(Ok(()))?;
        }
        Ok(())
    }

    /// Stops serving but keeps the ports open, for the process image that replaces this one
    /// (`listen`): new connections wait in the ports' queues meanwhile. Open connections get up
    /// to `within` to finish (a live view's stream never does).
    pub async fn hand_over(mut self, within: std::time::Duration) {
        // Their second descriptors stay open, for the next image.
        self.bound.clear();
        let _ = self.stop.send(true);
        let tasks = std::mem::take(&mut self.tasks);
        let _ = tokio::time::timeout(within, futures_util::future::join_all(tasks)).await;
    }
}

impl Drop for RunningServer {
    /// A server dropped without [`RunningServer::stop`] closes its ports all the same.
    fn drop(&mut self) {
        for &kept in &self.bound {
            super::listen::closed(kept);
        }
    }
}

/// The Host names a server on `host` must accept besides the defaults (its own origin is then
/// trusted as the same origin; see `origin`).
pub fn local_access(config: &mut ServerConfig, host: IpAddr) {
    if !host.is_loopback() && !host.is_unspecified() {
        config.allowed_hosts.push(host.to_string());
    }
}
