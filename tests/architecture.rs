//! The layering rules of `docs/architecture.md`, checked on the source: which module may import
//! which. A rule broken here is a design change to make on purpose (and to write down there).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src-tauri/src");

/// Every `.rs` file under `dir`, with its path relative to `src/`.
fn sources(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).unwrap() {
            let path: PathBuf = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(SRC).unwrap().to_string_lossy().replace('\\', "/");
                out.push((rel, fs::read_to_string(&path).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// The module paths a file names in `use` lines and in inline `crate::` paths, as written.
fn imports(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with("//") {
            continue;
        }
        for start in ["crate::", "super::"] {
            let mut rest = line;
            while let Some(i) = rest.find(start) {
                let path: String =
                    rest[i..].chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
                found.push(path.trim_end_matches(':').to_string());
                rest = &rest[i + start.len()..];
            }
        }
    }
    found
}

fn src(dir: &str) -> PathBuf {
    Path::new(SRC).join(dir)
}

#[test]
fn no_dialect_imports_the_openai_dialect() {
    let mut offenders = Vec::new();
    for (file, text) in sources(&src("server")) {
        // The router mounts it and the OpenAPI description documents it; both are not dialects.
        if file.starts_with("server/openai/") || file == "server/mod.rs" || file == "server/openapi.rs" {
            continue;
        }
        for path in imports(&text) {
            let is_openai = path.starts_with("crate::server::openai")
                || (file.starts_with("server/") && path.starts_with("super::openai"));
            // `super::` from a dialect's folder reaches `server::`, so `super::super::openai` too.
            if is_openai || path.contains("super::openai") {
                offenders.push(format!("{file}: {path}"));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "the chat core and the other dialects must not import server::openai:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn no_dialect_imports_another() {
    let dialects = ["openai", "anthropic", "ollama", "responses"];
    let mut offenders = Vec::new();
    for dialect in dialects {
        for (file, text) in sources(&src(&format!("server/{dialect}"))) {
            for path in imports(&text) {
                let other = dialects.iter().filter(|d| **d != dialect).find(|d| {
                    // From a dialect's mod.rs, `super::` is `server::` already.
                    let from_mod = file.ends_with("/mod.rs") && path.starts_with(&format!("super::{d}"));
                    path.starts_with(&format!("crate::server::{d}"))
                        || path.starts_with(&format!("super::super::{d}"))
                        || from_mod
                });
                if other.is_some() {
                    offenders.push(format!("{file}: {path}"));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "dialects translate into the chat core, never through each other:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn the_chat_core_imports_no_dialect() {
    let dialects = ["openai", "anthropic", "ollama", "responses"];
    let mut offenders = Vec::new();
    for (file, text) in sources(&src("server/chat")) {
        for path in imports(&text) {
            if dialects.iter().any(|d| {
                path.starts_with(&format!("crate::server::{d}")) || path.starts_with(&format!("super::super::{d}"))
            }) {
                offenders.push(format!("{file}: {path}"));
            }
        }
    }
    assert!(offenders.is_empty(), "server::chat is shared by the dialects and imports none:\n{}", offenders.join("\n"));
}

#[test]
fn lower_layers_do_not_import_higher_ones() {
    // (layer, what it must not import)
    let rules: &[(&str, &[&str])] = &[
        ("model", &["crate::engine", "crate::server", "crate::store", "crate::desktop", "crate::cli"]),
        ("engine", &["crate::server", "crate::store", "crate::desktop", "crate::cli"]),
        ("store", &["crate::server", "crate::desktop", "crate::cli"]),
        ("server", &["crate::desktop", "crate::cli"]),
        ("mlx", &["crate::engine", "crate::model", "crate::server", "crate::store"]),
    ];
    let mut offenders = Vec::new();
    for (layer, banned) in rules {
        for (file, text) in sources(&src(layer)) {
            for path in imports(&text) {
                if banned.iter().any(|b| path.starts_with(b)) {
                    offenders.push(format!("{file}: {path}"));
                }
            }
        }
    }
    assert!(offenders.is_empty(), "imports against the layering:\n{}", offenders.join("\n"));
}

#[test]
fn engine_files_import_each_other_without_circles() {
    let files = sources(&src("engine"));
    // A file's module: `engine/handle.rs` is `handle`, `engine/scheduler/prefill.rs` is `scheduler`.
    let module =
        |file: &str| file.trim_start_matches("engine/").trim_end_matches(".rs").split('/').next().unwrap().to_string();
    let names: BTreeSet<String> = files.iter().map(|(f, _)| module(f)).filter(|m| m != "mod").collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, text) in &files {
        let from = module(file);
        if from == "mod" {
            continue;
        }
        let targets = imports(text)
            .into_iter()
            .filter_map(|p| {
                p.strip_prefix("super::")
                    .or_else(|| p.strip_prefix("crate::engine::"))
                    .map(|r| r.split("::").next().unwrap().to_string())
            })
            .filter(|t| names.contains(t) && *t != from)
            .collect::<Vec<_>>();
        edges.entry(from).or_default().extend(targets);
    }
    // Depth-first search for a back edge.
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut cycle = path[i..].to_vec();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for next in edges.get(n).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for n in &names {
        if let Some(cycle) = visit(n, &edges, &mut Vec::new(), &mut done) {
            panic!("engine files import each other in a circle: {}", cycle.join(" -> "));
        }
    }
    assert!(
        edges.get("handle").is_some_and(|e| e.contains("scheduler")),
        "the check sees the engine's imports: {edges:?}"
    );
}
