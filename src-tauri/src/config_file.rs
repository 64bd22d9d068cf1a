//! Settings from a file in the platform config folder (`config.toml`), below the environment
//! and the flags: each key not already set in the environment becomes its `FASTMLX_*` variable,
//! which clap then reads. So flags win over the environment, and the environment over the file.
//!
//! ```toml
//! model = "/Users/me/models/Qwen2.5-7B-Instruct-4bit"
//! port = 8080
//! api_key = "sk-local"
//! ```

use std::path::PathBuf;

use anyhow::Context;

/// `FASTMLX_CONFIG`, else `<config dir>/FastMLX/config.toml`.
pub fn config_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("FASTMLX_CONFIG") {
        return Some(PathBuf::from(path));
    }
    directories::ProjectDirs::from("", "", "FastMLX").map(|d| d.config_dir().join("config.toml"))
}

/// The variables [`apply`] set from the file (a process the app starts leaves them out, so that
/// it reads the file as it is then, not as it was when the app started).
static APPLIED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

pub fn applied_keys() -> Vec<String> {
    APPLIED.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Applies the config file, if there is one. Must run before other threads start (it sets
/// environment variables).
pub fn apply() -> anyhow::Result<()> {
    let Some(path) = config_path().filter(|p| p.exists()) else { return Ok(()) };
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    for (key, value) in parse(&text).with_context(|| format!("in {}", path.display()))? {
        if std::env::var_os(&key).is_none() {
            // SAFETY: called at start-up, before any other thread exists.
            unsafe { std::env::set_var(&key, value) };
            APPLIED.lock().unwrap_or_else(|e| e.into_inner()).push(key);
        }
    }
    Ok(())
}

/// Sets (`Some`) or removes (`None`) keys of the config file at `path`, keeping its other keys
/// (the dashboard's settings survive a restart this way; comments in the file do not).
pub fn save(path: &std::path::Path, changes: &[(&str, Option<toml::Value>)]) -> anyhow::Result<()> {
    let mut table: toml::Table = match std::fs::read_to_string(path) {
        Ok(text) => text.parse().with_context(|| format!("{} is not valid TOML", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => toml::Table::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    for (key, value) in changes {
        match value {
            Some(v) => table.insert(key.to_string(), v.clone()),
            None => table.remove(*key),
        };
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, toml::to_string(&table)?).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// `key = value` pairs as `(FASTMLX_KEY, value)`; lists become comma-separated.
pub fn parse(text: &str) -> anyhow::Result<Vec<(String, String)>> {
    let table: toml::Table = text.parse().context("not valid TOML")?;
    table
        .into_iter()
        .map(|(key, value)| {
            let value = match &value {
                toml::Value::Array(items) => items.iter().map(scalar).collect::<Option<Vec<_>>>().map(|v| v.join(",")),
                other => scalar(other),
            };
            let value =
                value.ok_or_else(|| anyhow::anyhow!("{key}: expected a string, number, boolean or list of them"))?;
            Ok((format!("FASTMLX_{}", key.to_ascii_uppercase().replace('-', "_")), value))
        })
        .collect()
}

fn scalar(value: &toml::Value) -> Option<String> {
    Some(match value {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_become_environment_variables() {
        let mut pairs = parse("port = 9000\napi-key = \"k\"\nallowed_hosts = [\"a.local\", \"b.local\"]\n").unwrap();
        pairs.sort();
        assert_eq!(
            pairs,
            vec![
                ("FASTMLX_ALLOWED_HOSTS".to_string(), "a.local,b.local".to_string()),
                ("FASTMLX_API_KEY".to_string(), "k".to_string()),
                ("FASTMLX_PORT".to_string(), "9000".to_string()),
            ]
        );
        assert!(parse("port = ").is_err());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/config.toml");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "port = 9000\nkeep_alive = 60\n").unwrap();
        save(&path, &[("max_batch", Some(toml::Value::Integer(4))), ("keep_alive", None)]).unwrap();
        let mut saved = parse(&std::fs::read_to_string(&path).unwrap()).unwrap();
        saved.sort();
        assert_eq!(
            saved,
            vec![("FASTMLX_MAX_BATCH".to_string(), "4".to_string()), ("FASTMLX_PORT".to_string(), "9000".to_string())]
        );
        assert!(parse("[server]\nport = 1").is_err());
    }
}
