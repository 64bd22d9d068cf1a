//! Running the API on a socket, stoppable: `fastmlx serve` runs one until a signal, the
//! desktop app starts and stops one from its menu.

use std::net::{IpAddr, SocketAddr};

use tokio::sync::oneshot;

use super::{app, AppState, ServerConfig};
use crate::store::{Pulls, Residency};

pub struct RunningServer {
    pub address: SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl RunningServer {
    /// Binds `host:port` (0: any free port) and serves until [`RunningServer::stop`].
    pub async fn start(models: Residency, pulls: Pulls, mut config: ServerConfig, host: IpAddr, port: u16) -> std::io::Result<RunningServer> {
        let listener = tokio::net::TcpListener::bind((host, port)).await?;
        let address = listener.local_addr()?;
        config.listen = Some(address);
        let state = AppState::from_parts(models, pulls, config);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, app(state))
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
        });
        Ok(RunningServer { address, stop, task })
    }

    /// The OpenAI base URL.
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.address)
    }

    /// Stops listening and waits for open connections to finish (streams end when their
    /// engines do: unload the models first to cut them short).
    pub async fn stop(self) -> std::io::Result<()> {
        let _ = self.stop.send(());
        self.task.await.unwrap_or(Ok(()))
    }
}

/// The CORS origins and Host names a server on `host:port` must accept besides the defaults.
pub fn local_access(config: &mut ServerConfig, host: IpAddr, port: u16) {
    if !host.is_loopback() && !host.is_unspecified() {
        config.allowed_hosts.push(host.to_string());
    }
    config.allowed_origins.push(format!("http://localhost:{port}"));
    config.allowed_origins.push(format!("http://127.0.0.1:{port}"));
}
