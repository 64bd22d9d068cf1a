//! The few native things the web UI asks of the app (everything else is the HTTP API).

use tauri::{AppHandle, Runtime};
use tauri_plugin_clipboard_manager::ClipboardExt;

use super::app::{show_window, Window};

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

/// Launch at login is not wired to the OS yet: the UI hides the switch when this fails.
#[tauri::command]
pub fn get_launch_at_login() -> Result<bool, String> {
    Err("launch at login is not available in this build yet".into())
}

#[tauri::command]
pub fn set_launch_at_login(enabled: bool) -> Result<(), String> {
    let _ = enabled;
    Err("launch at login is not available in this build yet".into())
}
