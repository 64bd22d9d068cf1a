//! Starting the app: the server in-process, the tray icon and its menu, the two windows.

use std::sync::Arc;
use std::time::Duration;

use tauri::menu::{CheckMenuItem, Menu, MenuItem, PredefinedMenuItem};
use tauri::tray::TrayIconBuilder;
use tauri::{AppHandle, Manager, Runtime, WebviewUrl, WebviewWindowBuilder};
use tauri_plugin_clipboard_manager::ClipboardExt;

use super::control::Control;
use super::tray::{self, model_label, Action, Item};
use crate::cli::ServeArgs;
use crate::store::hub::HubClient;
use crate::store::Pulls;

const TRAY_ID: &str = "fastmlx";

#[derive(Clone, Copy)]
pub enum Window {
    Dashboard,
    Chat,
}

impl Window {
    fn label(self) -> &'static str {
        match self {
            Window::Dashboard => "dashboard",
            Window::Chat => "chat",
        }
    }
}

/// `fastmlx app`: serves like `fastmlx serve` and shows the menu-bar icon (and, unless
/// `hidden`, the dashboard); serves its first model unless `no_model`.
/// `flags` are the app's own `serve` flags, passed on to a cluster's child process.
pub fn run(args: ServeArgs, hidden: bool, no_model: bool, flags: Vec<std::ffi::OsString>) -> anyhow::Result<()> {
    let runtime = Arc::new(tokio::runtime::Builder::new_multi_thread().enable_all().build()?);
    let models = args.residency()?;
    let pulls = Pulls::new(models.catalog().paths().clone(), HubClient::from_env());
    let (host, port) = args.address();
    let control =
        Arc::new(Control::new(runtime.clone(), (models.clone(), pulls), args.server_config(), (host, port), flags));
    let url = control.start_server()?;
    eprintln!("FastMLX app serving at {url}");
    {
        let _guard = runtime.enter();
        models.spawn_idle_reaper();
    }
    // The first model loads in the background: the menu says "loading…" meanwhile.
    // A path given at start is added to the catalog, so the menu and the API know it by its id.
    if let Some(first) = args.first_model().ok().filter(|_| !no_model) {
        match models.catalog().find_or_add_path(&first.to_string_lossy()) {
            Ok(model) => control.serve_model(model.id),
            Err(e) => tracing::error!("cannot serve {}: {e}", first.display()),
        }
    }

    let app = tauri::Builder::default()
        .plugin(tauri_plugin_clipboard_manager::init())
        .manage(control.clone())
        .invoke_handler(invoke_handler())
        .setup(move |app| {
            #[cfg(target_os = "macos")]
            app.set_activation_policy(tauri::ActivationPolicy::Accessory);
            let tray_ok = install_tray(app.handle());
            if !hidden || !tray_ok {
                show_window(app.handle(), Window::Dashboard)?;
            }
            spawn_menu_refresh(app.handle().clone());
            Ok(())
        })
        .build(tauri::generate_context!())?;
    app.run(|_app, event| {
        // Closing the windows leaves the app in the menu bar; only Quit ends it.
        if let tauri::RunEvent::ExitRequested { api, code: None, .. } = event {
            api.prevent_exit();
        }
    });
    // A cluster's rank ends with the app (rank 0's end starts the app's server: stopped after).
    control.stop_cluster();
    control.stop_server();
    runtime.block_on(models.unload_all());
    Ok(())
}

/// The commands the web UI may invoke.
#[cfg(not(feature = "desktop-tests"))]
fn invoke_handler<R: Runtime>() -> impl Fn(tauri::ipc::Invoke<R>) -> bool + Send + Sync + 'static {
    use super::commands::*;
    tauri::generate_handler![
        open_chat,
        open_dashboard,
        copy_text,
        get_launch_at_login,
        set_launch_at_login,
        start_cluster,
        stop_cluster,
        cluster_launch
    ]
}

/// The commands the web UI may invoke, and the menu's rows and clicks for the desktop tests.
#[cfg(feature = "desktop-tests")]
fn invoke_handler<R: Runtime>() -> impl Fn(tauri::ipc::Invoke<R>) -> bool + Send + Sync + 'static {
    use super::commands::*;
    tauri::generate_handler![
        open_chat,
        open_dashboard,
        copy_text,
        get_launch_at_login,
        set_launch_at_login,
        start_cluster,
        stop_cluster,
        cluster_launch,
        test_tray_menu,
        test_tray_click
    ]
}

/// The tray icon. Some Linux desktops have no tray host, and without the appindicator library
/// its loader panics: log and carry on without a tray (the dashboard opens instead).
fn install_tray<R: Runtime>(app: &AppHandle<R>) -> bool {
    let build = || -> tauri::Result<()> {
        let menu = native_menu(app, &tray::menu(&Default::default()))?;
        let icon = tauri::image::Image::from_bytes(include_bytes!("../../../icons/tray.png"))?;
        TrayIconBuilder::with_id(TRAY_ID)
            .icon(icon)
            .icon_as_template(true)
            .tooltip("FastMLX")
            .menu(&menu)
            .on_menu_event(|app, event| on_action(app, event.id().as_ref()))
            .build(app)?;
        Ok(())
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(build)) {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::warn!("no menu-bar icon: {e}");
            false
        }
        Err(_) => {
            tracing::warn!("no menu-bar icon: the tray library is missing (libayatana-appindicator3)");
            false
        }
    }
}

fn native_menu<R: Runtime>(app: &AppHandle<R>, items: &[Item]) -> tauri::Result<Menu<R>> {
    let menu = Menu::new(app)?;
    for item in items {
        match item {
            Item::Label(text) => menu.append(&MenuItem::new(app, text, false, None::<&str>)?)?,
            Item::Separator => menu.append(&PredefinedMenuItem::separator(app)?)?,
            Item::Model { id, checked, loading, enabled } => {
                let action = Action::ServeModel(id.clone());
                menu.append(&CheckMenuItem::with_id(
                    app,
                    action.id(),
                    model_label(id, *loading),
                    *enabled,
                    *checked,
                    None::<&str>,
                )?)?
            }
            Item::Button { action, label, enabled } => {
                menu.append(&MenuItem::with_id(app, action.id(), label, *enabled, None::<&str>)?)?
            }
        }
    }
    Ok(menu)
}

/// Rebuilds the menu when what it shows changes (models added or removed, loading, serving,
/// the speed), checking every second.
fn spawn_menu_refresh<R: Runtime>(app: AppHandle<R>) {
    std::thread::spawn(move || loop {
        let control = app.state::<Arc<Control>>().inner().clone();
        let state = control.tray_state();
        let changed = {
            let mut shown = control.shown.lock().unwrap_or_else(|e| e.into_inner());
            let changed = shown.as_ref() != Some(&state);
            *shown = Some(state.clone());
            changed
        };
        if changed {
            if let Some(tray) = app.tray_by_id(TRAY_ID) {
                match native_menu(&app, &tray::menu(&state)) {
                    Ok(menu) => {
                        let _ = tray.set_menu(Some(menu));
                    }
                    Err(e) => tracing::warn!("cannot rebuild the menu: {e}"),
                }
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    });
}

pub(super) fn on_action<R: Runtime>(app: &AppHandle<R>, id: &str) {
    let Some(action) = Action::from_id(id) else { return };
    let control = app.state::<Arc<Control>>().inner().clone();
    let result: anyhow::Result<()> = match action {
        Action::ServeModel(model) => {
            control.serve_model(model);
            Ok(())
        }
        Action::OpenDashboard => show_window(app, Window::Dashboard).map_err(Into::into),
        Action::ChooseModel => show_discover(app).map_err(Into::into),
        Action::OpenChat => show_window(app, Window::Chat).map_err(Into::into),
        Action::CopyApiUrl => match control.url() {
            Some(url) => app.clipboard().write_text(url).map_err(Into::into),
            None => Ok(()),
        },
        Action::StopCluster => {
            // Waits for the child to end: off the menu's thread.
            std::thread::spawn(move || control.stop_cluster());
            Ok(())
        }
        Action::TakeBack => {
            // A request to rank 0's server: off the menu's thread.
            std::thread::spawn(move || {
                if let Err(e) = control.take_back() {
                    tracing::error!("take-back: {e:#}");
                }
            });
            Ok(())
        }
        Action::ToggleServer => {
            if control.url().is_some() {
                control.stop_server();
                Ok(())
            } else {
                control.start_server().map(|_| ())
            }
        }
        Action::Quit => {
            app.exit(0);
            Ok(())
        }
    };
    if let Err(e) = result {
        tracing::error!("{id}: {e:#}");
    }
}

/// The dashboard on Discover's recommendations (the first run's way to a model).
fn show_discover<R: Runtime>(app: &AppHandle<R>) -> tauri::Result<()> {
    show_window(app, Window::Dashboard)?;
    match app.get_webview_window(Window::Dashboard.label()) {
        Some(window) => window.eval("window.location.hash = '#/discover'"),
        None => Ok(()),
    }
}

/// Shows a window, creating it the first time; the page learns the API's address from
/// `window.__FASTMLX__`.
pub fn show_window<R: Runtime>(app: &AppHandle<R>, window: Window) -> tauri::Result<()> {
    if let Some(existing) = app.get_webview_window(window.label()) {
        existing.show()?;
        return existing.set_focus();
    }
    let control = app.state::<Arc<Control>>().inner().clone();
    let key =
        control.config.api_key.as_ref().map_or("null".to_string(), |k| serde_json::to_string(k).unwrap_or_default());
    let script = format!(
        "window.__FASTMLX__ = {{ apiBase: {}, apiKey: {key}, desktop: true }};",
        serde_json::to_string(&control.api_base()).unwrap_or_default()
    );
    let (route, title, size) = match window {
        Window::Dashboard => ("index.html#/models", "FastMLX", (1100.0, 760.0)),
        Window::Chat => ("index.html#/chat", "FastMLX Chat", (820.0, 760.0)),
    };
    WebviewWindowBuilder::new(app, window.label(), WebviewUrl::App(route.into()))
        .title(title)
        .inner_size(size.0, size.1)
        .initialization_script(script)
        // Files dropped on the window reach the page as HTML5 drops (the chat attaches images);
        // Tauri's own handler would take them first.
        .disable_drag_drop_handler()
        .build()?;
    Ok(())
}
