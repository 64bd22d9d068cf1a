//! The Origin guard: web pages the user opens must not drive the local server.
//!
//! The server listens on localhost without a key by default (as Ollama and LM Studio do), so any
//! page in the user's browser can send it "simple" cross-origin requests (a `POST` with
//! `Content-Type: text/plain`, a form post). CORS only stops such a page from *reading* the
//! answer; the request itself — a pull, an unload, a settings change, compute — would still
//! happen. Browsers always name the page's origin in `Origin` on cross-origin `POST`s and on
//! every `fetch` but a same-origin `GET`, and no SDK, `curl` or IDE plugin outside a browser
//! sends one, so the rule is on `Origin`: present and not trusted → 403 before any handler
//! runs. A request without `Origin` that a browser marks `Sec-Fetch-Site: cross-site` and that
//! is not a navigation (an `<img>` or `<script>` pointed at the API) is refused too; a person
//! following a link to the UI is a navigation and gets through. The CORS layer asks the same
//! [`trusted`] function, so a preflight and the request it announces always agree.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::AppState;

/// The desktop app's webview origins (macOS and Linux; Windows).
const APP_ORIGINS: &[&str] = &["tauri://localhost", "http://tauri.localhost", "https://tauri.localhost"];
/// Editor webviews (VS Code and its forks run extensions' panels there), as Ollama trusts them.
const EDITOR_SCHEMES: &[&str] = &["vscode-webview", "vscode-file"];
/// Host names that only this machine answers to.
const LOCAL_HOSTS: &[&str] = &["localhost", "127.0.0.1", "[::1]"];

/// Whether a page at `origin` may use the server: the server's own origin (`host` is the
/// request's `Host`), local and app origins, editor webviews, and the configured ones (`*`
/// trusts every origin). `Origin: null` (sandboxed frames, `file://` pages) is not trusted.
pub fn trusted(origin: &str, host: Option<&str>, allowed: &[String]) -> bool {
    let origin = origin.trim().trim_end_matches('/');
    if allowed.iter().any(|a| a == "*" || a.trim().trim_end_matches('/').eq_ignore_ascii_case(origin)) {
        return true;
    }
    if APP_ORIGINS.iter().any(|a| a.eq_ignore_ascii_case(origin)) {
        return true;
    }
    let Some((scheme, authority)) = origin.split_once("://") else { return false };
    let scheme = scheme.to_ascii_lowercase();
    if EDITOR_SCHEMES.contains(&scheme.as_str()) {
        return !authority.is_empty();
    }
    if scheme != "http" && scheme != "https" || authority.is_empty() || authority.contains(['/', '@', '?', '#']) {
        return false;
    }
    if host.is_some_and(|h| h.eq_ignore_ascii_case(authority)) {
        return true;
    }
    LOCAL_HOSTS.iter().any(|local| name_of(authority).eq_ignore_ascii_case(local))
}

/// `host` of `host[:port]` (`[v6]` kept with its brackets).
fn name_of(authority: &str) -> &str {
    if authority.starts_with('[') {
        return authority.split_inclusive(']').next().unwrap_or(authority);
    }
    match authority.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
        _ => authority,
    }
}

/// Why a request from a browser is refused, if it is.
pub fn refusal(headers: &HeaderMap, allowed: &[String]) -> Option<String> {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    match headers.get(header::ORIGIN) {
        Some(origin) => {
            let origin = origin.to_str().unwrap_or("(not text)");
            (!trusted(origin, host, allowed)).then(|| {
                format!("requests from the web page origin {origin:?} are not allowed: pages in a browser may not drive this server (trust an origin with --allowed-origin)")
            })
        }
        None => {
            let fetch = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default();
            let cross_site = fetch("sec-fetch-site").eq_ignore_ascii_case("cross-site");
            let navigation = fetch("sec-fetch-mode").eq_ignore_ascii_case("navigate");
            let wildcard = allowed.iter().any(|a| a == "*");
            (cross_site && !navigation && !wildcard).then(|| {
                "cross-site requests from a web page are not allowed (trust an origin with --allowed-origin)"
                    .to_string()
            })
        }
    }
}

/// Refuses requests from untrusted web pages with a 403 in the dialect's envelope.
pub async fn check_origin(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if let Some(message) = refusal(request.headers(), &state.config.allowed_origins) {
        return ApiError::new(StatusCode::FORBIDDEN, "permission_error", message).into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_origins_are_trusted() {
        let none: Vec<String> = Vec::new();
        let host = Some("127.0.0.1:8080");
        for ok in [
            "http://127.0.0.1:8080",
            "http://localhost:5173",
            "https://localhost",
            "http://[::1]:3000",
            "HTTP://LOCALHOST:1",
            "tauri://localhost",
            "http://tauri.localhost",
            "vscode-webview://1f2e3d",
            "vscode-file://vscode-app",
        ] {
            assert!(trusted(ok, host, &none), "{ok}");
        }
        for bad in [
            "https://evil.example",
            "null",
            "",
            "http://localhost.evil.example",
            "http://127.0.0.1.evil.example:8080",
            "http://evil.example@localhost",
            "file://",
            "vscode-webview://",
            "ftp://localhost",
            "http://127.0.0.2:8080",
        ] {
            assert!(!trusted(bad, host, &none), "{bad}");
        }
        // The server's own origin under a LAN name it was allowed to answer to.
        assert!(trusted("http://mybox.local:8080", Some("mybox.local:8080"), &none));
        assert!(!trusted("http://mybox.local:9999", Some("mybox.local:8080"), &none));
        let allowed = vec!["https://app.example/".to_string()];
        assert!(trusted("https://app.example", host, &allowed));
        assert!(!trusted("https://other.example", host, &allowed));
        assert!(trusted("https://other.example", host, &["*".to_string()]));
    }

    #[test]
    fn requests_without_an_origin() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, v.parse().unwrap());
            }
            h
        };
        assert!(refusal(&headers(&[]), &[]).is_none(), "SDKs and curl send no Origin");
        assert!(
            refusal(&headers(&[("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "navigate")]), &[]).is_none(),
            "a link to the UI"
        );
        assert!(
            refusal(&headers(&[("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "no-cors")]), &[]).is_some(),
            "an <img> at the API"
        );
        assert!(refusal(&headers(&[("sec-fetch-site", "same-origin")]), &[]).is_none());
        assert!(refusal(&headers(&[("origin", "null")]), &[]).is_some());
    }
}
