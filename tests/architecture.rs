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

/// The text without its line comments.
fn code(text: &str) -> String {
    text.lines().map(|line| line.split_once("//").map_or(line, |(code, _)| code)).collect::<Vec<_>>().join("\n")
}

/// The part of a file that is not test code: a `tests.rs` is all tests, and a file's tests sit
/// after its `#[cfg(test)]`.
fn non_test(file: &str, text: &str) -> String {
    if file.ends_with("/tests.rs") {
        return String::new();
    }
    text.split("#[cfg(test)]").next().unwrap_or_default().to_string()
}

/// `prefix` joined with each path of a use tree's group (`a, b::{c, d}, self`).
fn expand(prefix: &str, group: &str, out: &mut Vec<String>) {
    let (mut depth, mut start) = (0, 0);
    let mut items = Vec::new();
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&group[start..]);
    for item in items.into_iter().map(str::trim).filter(|i| !i.is_empty()) {
        let item = item.split(" as ").next().unwrap_or(item).trim();
        match item.split_once('{') {
            Some((head, rest)) => expand(&format!("{prefix}{head}"), rest.strip_suffix('}').unwrap_or(rest), out),
            None if item == "self" => out.push(prefix.trim_end_matches(':').to_string()),
            None => out.push(format!("{prefix}{item}")),
        }
    }
}

/// The module paths a file names, in `use` trees (groups expanded, over several lines) and in
/// inline `crate::`/`super::` paths, as written.
fn imports(text: &str) -> Vec<String> {
    let code = code(text);
    let mut found = Vec::new();
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(start).map(|i| from + i) {
            from = i + start.len();
            // Inside a path that began earlier (`super::super::`, `crate::a::super`): not a new one.
            let before = code[..i].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let path: String =
                code[i..].chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
            let after = &code[i + path.len()..];
            if path.ends_with("::") && after.starts_with('{') {
                // A use tree's group, to its matching brace.
                let mut depth = 0;
                let end = after
                    .char_indices()
                    .find(|&(_, c)| {
                        depth += match c {
                            '{' => 1,
                            '}' => -1,
                            _ => 0,
                        };
                        depth == 0
                    })
                    .map_or(after.len(), |(at, _)| at);
                expand(&path, &after[1..end], &mut found);
            } else {
                found.push(path.trim_end_matches(':').to_string());
            }
        }
    }
    found
}

fn src(dir: &str) -> PathBuf {
    Path::new(SRC).join(dir)
}

/// The modules under `layer` (`engine/handle.rs` is `handle`, `engine/scheduler/prefill.rs` is
/// `scheduler`) and which import which, test code left out.
fn module_graph(layer: &str) -> BTreeMap<String, BTreeSet<String>> {
    let files = sources(&src(layer));
    let prefix = format!("{layer}/");
    let module =
        |file: &str| file.trim_start_matches(&prefix).trim_end_matches(".rs").split('/').next().unwrap().to_string();
    let names: BTreeSet<String> = files.iter().map(|(f, _)| module(f)).filter(|m| m != "mod").collect();
    let crate_prefix = format!("crate::{}::", layer.replace('/', "::"));
    let mut edges: BTreeMap<String, BTreeSet<String>> = names.iter().map(|n| (n.clone(), BTreeSet::new())).collect();
    for (file, text) in &files {
        let from = module(file);
        if from == "mod" {
            continue;
        }
        // `super::` from `layer/x.rs` or `layer/x/mod.rs` is the layer; deeper files' `super::`
        // stays inside their own module.
        let rel = file.trim_start_matches(&prefix);
        let top_level = !rel.contains('/') || rel.ends_with("/mod.rs") && rel.matches('/').count() == 1;
        let targets: Vec<String> = imports(&non_test(file, text))
            .into_iter()
            .filter_map(|p| {
                p.strip_prefix(&crate_prefix)
                    .or_else(|| if top_level { p.strip_prefix("super::") } else { None })
                    .map(|r| r.split("::").next().unwrap().to_string())
            })
            .filter(|t| names.contains(t) && *t != from)
            .collect();
        edges.entry(from).or_default().extend(targets);
    }
    edges
}

/// A circle among the modules of `layer`, if there is one.
fn circle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
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
    edges.keys().find_map(|n| visit(n, edges, &mut Vec::new(), &mut done))
}

#[test]
fn the_import_reader_sees_groups_and_nested_paths() {
    let text = "use crate::model::{cache::{KvCache, LayerCache}, layers as l, self};\n\
                use super::{\n    piece::Piece,\n    format,\n};\n\
                let x = crate::mlx::memory_stats(); // crate::ignored::path\n\
                use super::super::openai::Types;";
    let found = imports(text);
    for expected in [
        "crate::model::cache::KvCache",
        "crate::model::cache::LayerCache",
        "crate::model::layers",
        "crate::model",
        "super::piece::Piece",
        "super::format",
        "crate::mlx::memory_stats",
        "super::super::openai::Types",
    ] {
        assert!(found.iter().any(|f| f == expected), "{expected} not in {found:?}");
    }
    assert!(!found.iter().any(|f| f.contains("ignored")), "comments are not imports: {found:?}");
    let edges = BTreeMap::from([
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["a".to_string()])),
    ]);
    assert_eq!(circle(&edges), Some(vec!["a".to_string(), "b".to_string(), "a".to_string()]));
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
        (
            "model",
            &["crate::engine", "crate::server", "crate::store", "crate::desktop", "crate::cli", "crate::fixtures"],
        ),
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

/// The leaves import (outside their tests) only what `docs/architecture.md` says: `constrain`
/// nothing of the crate, `tokenizer` only `constrain`, `sampling` only `constrain`, `model` only
/// `mlx` and `tokenizer`, `fixtures` only `model` and `sampling` (and the test models are used
/// by no serving code: only `cli`'s `make-test-model` and tests).
#[test]
fn the_leaves_import_only_what_they_may() {
    let rules: &[(&str, &[&str])] = &[
        ("constrain", &[]),
        ("tokenizer", &["constrain"]),
        ("sampling", &["constrain"]),
        ("mlx", &[]),
        ("model", &["mlx", "tokenizer"]),
        ("fixtures", &["model", "sampling"]),
    ];
    let mut offenders = Vec::new();
    for (layer, allowed) in rules {
        for (file, text) in sources(&src(layer)) {
            for path in imports(&non_test(&file, &text)) {
                let Some(rest) = path.strip_prefix("crate::") else { continue };
                let target = rest.split("::").next().unwrap_or_default();
                if target != *layer && !allowed.contains(&target) {
                    offenders.push(format!("{file}: {path}"));
                }
            }
        }
    }
    for (file, text) in sources(Path::new(SRC)) {
        let user = file.split('/').next().unwrap_or_default();
        if ["fixtures", "cli"].contains(&user) {
            continue;
        }
        for path in imports(&non_test(&file, &text)).into_iter().filter(|p| p.starts_with("crate::fixtures")) {
            offenders.push(format!("{file}: {path} (the test models are for tests and make-test-model)"));
        }
    }
    assert!(offenders.is_empty(), "a leaf imports what it must not:\n{}", offenders.join("\n"));
}

/// Within these layers no module imports one that imports it back (a module is a file or a
/// folder directly under the layer): each can be read and changed from the bottom up.
#[test]
fn no_circles_inside_the_engine_the_model_and_the_chat_core() {
    for layer in ["engine", "model", "server/chat"] {
        let edges = module_graph(layer);
        if let Some(cycle) = circle(&edges) {
            panic!("{layer}: modules import each other in a circle: {}", cycle.join(" -> "));
        }
    }
    let engine = module_graph("engine");
    assert!(engine["handle"].contains("scheduler"), "the check sees the engine's imports: {engine:?}");
    let model = module_graph("model");
    assert!(model["layers"].contains("cache"), "the check sees the model's imports: {model:?}");
    let chat = module_graph("server/chat");
    assert!(chat["answer"].contains("format"), "the check sees the chat core's imports: {chat:?}");
}
