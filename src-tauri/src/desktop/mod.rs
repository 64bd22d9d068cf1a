//! The menu-bar app (feature `desktop`): a tray icon listing the local models and the server's
//! controls, a dashboard window and a chat window showing the web UI (`ui/`), which talks to the
//! in-process server over HTTP like any client. Thin on purpose: what the menu shows and does is
//! decided in [`tray`] (plain, unit-tested), the rest is Tauri glue.

pub mod autostart;
pub mod cluster_launch;
pub mod tray;

#[cfg(feature = "desktop")]
mod app;
#[cfg(feature = "desktop")]
mod commands;
#[cfg(feature = "desktop")]
mod control;

#[cfg(feature = "desktop")]
pub use app::run;
