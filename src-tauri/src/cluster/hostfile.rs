//! The cluster's host file, in MLX's formats: the ring backend's own (each rank's `ip:port`
//! addresses: `[["10.0.0.1:5000"], ["10.0.0.2:5000"]]`), or `mlx.launch`'s (`[{"ssh": "mac-1",
//! "ips": ["10.0.0.1"]}, ...]`, each rank given `port`). Checked before MLX reads it, so a bad
//! file is a clear error here rather than a hang or an abort inside MLX.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// Each rank's addresses, in rank order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFile {
    pub ranks: Vec<Vec<String>>,
}

/// The port `mlx.launch`-style entries get (their file names hosts, not ports).
pub const DEFAULT_PORT: u16 = 32_323;

impl HostFile {
    pub fn read(path: &Path) -> Result<HostFile, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        HostFile::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<HostFile, String> {
        let json: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let entries = json.as_array().ok_or("a host file is a JSON list, one entry per rank")?;
        if entries.len() < 2 {
            return Err(format!("a cluster needs at least 2 ranks, the file lists {}", entries.len()));
        }
        let ranks = entries.iter().enumerate().map(|(rank, entry)| addresses(rank, entry)).collect::<Result<_, _>>()?;
        Ok(HostFile { ranks })
    }

    /// The file in the ring backend's format, for `MLX_HOSTFILE`.
    pub fn ring_json(&self) -> String {
        serde_json::to_string(&self.ranks).expect("strings serialise")
    }

    /// Writes [`Self::ring_json`] to a file MLX reads, and returns its path.
    pub fn write_ring_file(&self, dir: &Path) -> Result<PathBuf, String> {
        let path = dir.join("fastmlx-ring-hosts.json");
        std::fs::write(&path, self.ring_json()).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    }
}

fn addresses(rank: usize, entry: &Value) -> Result<Vec<String>, String> {
    let list: Vec<String> = match entry {
        Value::Array(items) => items
            .iter()
            .map(|a| a.as_str().map(str::to_string).ok_or_else(|| format!("rank {rank}: addresses are strings")))
            .collect::<Result<_, _>>()?,
        Value::Object(fields) => {
            let ips =
                fields.get("ips").and_then(Value::as_array).ok_or_else(|| format!("rank {rank}: no \"ips\" list"))?;
            ips.iter()
                .map(|ip| {
                    ip.as_str()
                        .map(|ip| format!("{ip}:{DEFAULT_PORT}"))
                        .ok_or_else(|| format!("rank {rank}: \"ips\" holds strings"))
                })
                .collect::<Result<_, _>>()?
        }
        other => {
            return Err(format!("rank {rank}: expected a list of addresses or an {{\"ips\": [..]}} entry, got {other}"))
        }
    };
    if list.is_empty() {
        return Err(format!("rank {rank}: no address"));
    }
    for address in &list {
        let (host, port) =
            address.rsplit_once(':').ok_or_else(|| format!("rank {rank}: {address:?} is not host:port"))?;
        if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(format!("rank {rank}: {address:?} is not host:port with a port from 1 to 65535"));
        }
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_formats_read_and_bad_files_say_why() {
        let ring = HostFile::parse(r#"[["127.0.0.1:5000"], ["127.0.0.1:5001", "10.0.0.2:5001"]]"#).unwrap();
        assert_eq!(ring.ranks[1], ["127.0.0.1:5001", "10.0.0.2:5001"]);
        assert_eq!(ring.ring_json(), r#"[["127.0.0.1:5000"],["127.0.0.1:5001","10.0.0.2:5001"]]"#);
        let launch =
            HostFile::parse(r#"[{"ssh": "mac-1", "ips": ["10.0.0.1"]}, {"ssh": "mac-2", "ips": ["10.0.0.2"]}]"#)
                .unwrap();
        assert_eq!(launch.ranks, [vec!["10.0.0.1:32323".to_string()], vec!["10.0.0.2:32323".to_string()]]);
        for (text, says) in [
            ("{}", "JSON list"),
            (r#"[["127.0.0.1:5000"]]"#, "at least 2 ranks"),
            (r#"[["127.0.0.1:5000"], ["127.0.0.1"]]"#, "rank 1"),
            (r#"[["127.0.0.1:5000"], ["127.0.0.1:0"]]"#, "port from 1"),
            (r#"[["127.0.0.1:5000"], []]"#, "no address"),
            (r#"[["127.0.0.1:5000"], {"ssh": "x"}]"#, "\"ips\""),
            ("[1, 2]", "rank 0"),
            ("not json", "not JSON"),
        ] {
            let err = HostFile::parse(text).unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
    }
}
