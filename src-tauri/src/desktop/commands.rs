//! The few native things the web UI asks of the app (everything else is the HTTP API).

use tauri::{AppHandle, Runtime};
use tauri_plugin_clipboard_manager::ClipboardExt;

use super::app::{show_window, Window};
use super::autostart::Autostart;

#[tauri::command]
pub fn open_chat<R: Runtime>(app: AppHandle<R>) -> Result<(), String> {
    show_window(&app, Window::Chat).map_err(|e| e.to_string())
}

#[tauri::command]
pub fn open_dashboard<R: Runtime>(app: AppHandle<R>) -> Result<(), String> {
    show_window(&app, Window::Dashboard).map_err(|e| e.to_string())
}

#[tauri::command]
pub fn copy_text<R: Runtime>(app: AppHandle<R>, text: String) -> Result<(), String> {
    app.clipboard().write_text(text).map_err(|e| e.to_string())
}

#[tauri::command]
pub fn get_launch_at_login() -> Result<bool, String> {
    Autostart::for_current_user().map(|a| a.is_enabled()).ok_or_else(unsupported)
}

#[tauri::command]
pub fn set_launch_at_login(enabled: bool) -> Result<(), String> {
    let autostart = Autostart::for_current_user().ok_or_else(unsupported)?;
    autostart.set_enabled(enabled).map_err(|e| format!("{}: {e}", autostart.entry().display()))
}

/// Starts this Mac's rank of a cluster (the Server page's form), as a child process serving
/// with the app's settings; for rank 0 the app's server steps aside meanwhile.
#[tauri::command]
pub async fn start_cluster(
    control: tauri::State<'_, std::sync::Arc<super::control::Control>>,
    plan: super::cluster_launch::ClusterPlan,
) -> Result<super::cluster_launch::ChildState, String> {
    let control = control.inner().clone();
    // It unloads models and stops a server: off the IPC thread, on a plain one.
    tokio::task::spawn_blocking(move || control.start_cluster(plan)).await.map_err(|e| e.to_string())?
}

/// Stops this Mac's rank of the cluster; returns how it ended.
#[tauri::command]
pub async fn stop_cluster(
    control: tauri::State<'_, std::sync::Arc<super::control::Control>>,
) -> Result<Option<super::cluster_launch::ChildState>, String> {
    let control = control.inner().clone();
    tokio::task::spawn_blocking(move || control.stop_cluster()).await.map_err(|e| e.to_string())
}

/// This Mac's rank of a cluster, running or how it ended, with its latest output.
#[tauri::command]
pub fn cluster_launch(
    control: tauri::State<'_, std::sync::Arc<super::control::Control>>,
) -> Option<super::cluster_launch::ChildState> {
    control.cluster_state()
}

fn unsupported() -> String {
    "launch at login is not available on this system".into()
}

/// One row of the menu-bar menu as the desktop tests read it.
#[cfg(feature = "desktop-tests")]
#[derive(serde::Serialize)]
pub struct MenuRow {
    /// The action a click runs (None: a label or separator).
    id: Option<String>,
    label: String,
    enabled: bool,
}

/// The menu-bar menu as it stands: the rows `tray::menu` builds from the state the menu was last
/// drawn from. For the desktop tests under Xvfb, where no tray host draws a menu to click.
#[cfg(feature = "desktop-tests")]
#[tauri::command]
pub fn test_tray_menu<R: Runtime>(app: AppHandle<R>) -> Vec<MenuRow> {
    use std::sync::Arc;
    use tauri::Manager;

    use super::control::Control;
    use super::tray::{self, model_label, Action, Item};

    let control = app.state::<Arc<Control>>().inner().clone();
    let shown = control.shown.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let state = shown.unwrap_or_else(|| control.tray_state());
    tray::menu(&state)
        .into_iter()
        .map(|item| match item {
            Item::Label(label) => MenuRow { id: None, label, enabled: false },
            Item::Separator => MenuRow { id: None, label: "-".into(), enabled: false },
            Item::Model { id, loading, enabled, .. } => {
                MenuRow { id: Some(Action::ServeModel(id.clone()).id()), label: model_label(&id, loading), enabled }
            }
            Item::Button { action, label, enabled } => MenuRow { id: Some(action.id()), label, enabled },
        })
        .collect()
}

/// Runs a menu item's action exactly as a click on it does.
#[cfg(feature = "desktop-tests")]
#[tauri::command]
pub fn test_tray_click<R: Runtime>(app: AppHandle<R>, id: String) {
    super::app::on_action(&app, &id);
}

/// The commands through Tauri's IPC on its mock runtime (no display): the windows they open and
/// the launch-at-login entry they write. Needs the `desktop-tests` feature (Tauri's `test`).
#[cfg(all(test, feature = "desktop-tests"))]
mod tests {
    use std::sync::Arc;

    use tauri::ipc::{CallbackFn, InvokeBody};
    use tauri::test::{get_ipc_response, mock_builder, mock_context, noop_assets, MockRuntime, INVOKE_KEY};
    use tauri::webview::InvokeRequest;
    use tauri::{App, Manager, WebviewWindow, WebviewWindowBuilder};

    use super::*;
    use crate::desktop::control::Control;
    use crate::server::ServerConfig;
    use crate::store::hub::HubClient;
    use crate::store::{Catalog, Pulls, Residency, ResidencyConfig, StorePaths};

    fn app(models_dir: &std::path::Path) -> (App<MockRuntime>, WebviewWindow<MockRuntime>) {
        let models = Residency::new(Catalog::new(StorePaths::only(models_dir)), ResidencyConfig::default());
        let control = Arc::new(Control::new(
            Arc::new(tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap()),
            (models, Pulls::new(StorePaths::only(models_dir), HubClient::new("http://127.0.0.1:9", None))),
            ServerConfig::default(),
            ([127, 0, 0, 1].into(), 8123),
            vec![],
        ));
        let app = mock_builder()
            .manage(control)
            .invoke_handler(tauri::generate_handler![
                open_chat,
                open_dashboard,
                get_launch_at_login,
                set_launch_at_login
            ])
            .build(mock_context(noop_assets()))
            .unwrap();
        let caller = WebviewWindowBuilder::new(&app, "caller", Default::default()).build().unwrap();
        (app, caller)
    }

    fn invoke(
        webview: &WebviewWindow<MockRuntime>,
        cmd: &str,
        body: serde_json::Value,
    ) -> Result<serde_json::Value, serde_json::Value> {
        let request = InvokeRequest {
            cmd: cmd.into(),
            callback: CallbackFn(0),
            error: CallbackFn(1),
            url: "tauri://localhost".parse().unwrap(),
            body: InvokeBody::Json(body),
            headers: Default::default(),
            invoke_key: INVOKE_KEY.to_string(),
        };
        get_ipc_response(webview, request).map(|b| b.deserialize::<serde_json::Value>().unwrap())
    }

    #[test]
    fn open_chat_and_dashboard_create_each_window_once() {
        let dir = tempfile::tempdir().unwrap();
        let (app, caller) = app(dir.path());
        assert!(app.get_webview_window("chat").is_none());
        invoke(&caller, "open_chat", serde_json::json!({})).unwrap();
        invoke(&caller, "open_chat", serde_json::json!({})).unwrap();
        invoke(&caller, "open_dashboard", serde_json::json!({})).unwrap();
        let labels: std::collections::BTreeSet<String> = app.webview_windows().into_keys().collect();
        assert_eq!(labels, ["caller", "chat", "dashboard"].into_iter().map(String::from).collect());
    }

    #[cfg(unix)]
    #[test]
    fn launch_at_login_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        // The entry goes under XDG_CONFIG_HOME on Linux; on macOS under HOME.
        std::env::set_var("XDG_CONFIG_HOME", dir.path().join("config"));
        #[cfg(target_vendor = "apple")]
        std::env::set_var("HOME", dir.path());
        let (_app, caller) = app(dir.path());
        assert_eq!(invoke(&caller, "get_launch_at_login", serde_json::json!({})), Ok(serde_json::json!(false)));
        invoke(&caller, "set_launch_at_login", serde_json::json!({"enabled": true})).unwrap();
        assert_eq!(invoke(&caller, "get_launch_at_login", serde_json::json!({})), Ok(serde_json::json!(true)));
        invoke(&caller, "set_launch_at_login", serde_json::json!({"enabled": false})).unwrap();
        assert_eq!(invoke(&caller, "get_launch_at_login", serde_json::json!({})), Ok(serde_json::json!(false)));
        assert!(
            invoke(&caller, "set_launch_at_login", serde_json::json!({"enabled": "yes"})).is_err(),
            "a bad argument is an error, not a crash"
        );
    }
}
