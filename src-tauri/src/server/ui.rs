//! The dashboard and chat UI (`ui/dist`, built by the setup step) served at `/ui/`, so it runs
//! in any browser as well as in the desktop app's windows. Embedded in release builds; debug
//! builds read `ui/dist` from disk, so a UI rebuild needs no Rust rebuild.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};

#[derive(rust_embed::RustEmbed)]
#[folder = "ui/dist/"]
#[allow_missing = true]
struct Assets;

pub async fn index() -> Response {
    asset("index.html")
}

pub async fn redirect() -> Redirect {
    Redirect::permanent("/ui/")
}

pub async fn file(Path(path): Path<String>) -> Response {
    asset(&path)
}

fn asset(path: &str) -> Response {
    match Assets::get(path) {
        Some(file) => {
            let mime = file.metadata.mimetype().to_string();
            // Hashed asset names can be cached for good; index.html must not be.
            let cache = if path == "index.html" { "no-cache" } else { "public, max-age=31536000, immutable" };
            ([(header::CONTENT_TYPE, mime), (header::CACHE_CONTROL, cache.to_string())], file.data).into_response()
        }
        None if path == "index.html" => {
            (StatusCode::NOT_FOUND, "the UI is not built: run scripts/setup.sh (it builds ui/ with npm)")
                .into_response()
        }
        None => super::ApiError::not_found("file").into_response(),
    }
}
