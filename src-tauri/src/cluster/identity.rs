//! What every rank must agree on before they serve together: the FastMLX version, the model
//! (its config and weight files: names, sizes and safetensors headers, so two copies of one
//! download agree whatever their paths and times) and the settings that change the numbers.

use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeIdentity {
    pub version: String,
    /// The model's folder (or file) name and a digest of what it holds.
    pub model: String,
    pub settings: String,
}

/// The bytes each rank shares (fixed, so every rank's fit one gathered array).
pub const WIRE_BYTES: usize = 1024;

impl NodeIdentity {
    pub fn of(model: &Path, settings: &str) -> Result<NodeIdentity, String> {
        let name = model.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        Ok(NodeIdentity {
            version: env!("CARGO_PKG_VERSION").to_string(),
            model: format!("{name} ({})", model_digest(model)?),
            settings: settings.to_string(),
        })
    }

    pub fn to_wire(&self) -> Result<Vec<u8>, String> {
        let text = format!("{}\u{1}{}\u{1}{}", self.version, self.model, self.settings);
        if text.len() > WIRE_BYTES {
            return Err(format!("the node's description is over {WIRE_BYTES} bytes"));
        }
        let mut bytes = text.into_bytes();
        bytes.resize(WIRE_BYTES, 0);
        Ok(bytes)
    }

    pub fn from_wire(bytes: &[u8]) -> Option<NodeIdentity> {
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        let text = std::str::from_utf8(&bytes[..end]).ok()?;
        let mut parts = text.split('\u{1}');
        Some(NodeIdentity {
            version: parts.next()?.to_string(),
            model: parts.next()?.to_string(),
            settings: parts.next()?.to_string(),
        })
    }

    /// What differs between rank 0's identity (`self`) and rank `rank`'s, in words.
    pub fn mismatch(&self, rank: usize, other: &NodeIdentity) -> Option<String> {
        let mut out = Vec::new();
        if self.version != other.version {
            out.push(format!("FastMLX {} on rank {rank}, {} on rank 0", other.version, self.version));
        }
        if self.model != other.model {
            out.push(format!("model {} on rank {rank}, {} on rank 0", other.model, self.model));
        }
        if self.settings != other.settings {
            out.push(format!("settings {:?} on rank {rank}, {:?} on rank 0", other.settings, self.settings));
        }
        (!out.is_empty()).then(|| out.join("; "))
    }
}

/// A digest of the model's config and weight files (16 hex digits).
fn model_digest(model: &Path) -> Result<String, String> {
    let mut files: Vec<std::path::PathBuf> = if model.is_dir() {
        std::fs::read_dir(model)
            .map_err(|e| format!("{}: {e}", model.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                name == "config.json" || name.ends_with(".safetensors") || name.ends_with(".gguf")
            })
            .collect()
    } else if model.is_file() {
        vec![model.to_path_buf()]
    } else {
        return Err(format!("{}: no such model folder or file", model.display()));
    };
    files.sort();
    if files.is_empty() {
        return Err(format!("{}: no config.json or weights", model.display()));
    }
    let mut h = Sha256::new();
    for file in files {
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let size = std::fs::metadata(&file).map_err(|e| format!("{}: {e}", file.display()))?.len();
        h.update(format!("{name}\0{size}\0").as_bytes());
        if name == "config.json" {
            h.update(std::fs::read(&file).map_err(|e| format!("{}: {e}", file.display()))?);
        } else if name.ends_with(".safetensors") {
            h.update(safetensors_header(&file)?);
        }
    }
    let digest = h.finalize();
    Ok(digest[..8].iter().map(|b| format!("{b:02x}")).collect())
}

/// A safetensors file's header: every tensor's name, dtype, shape and place in the file.
fn safetensors_header(file: &Path) -> Result<Vec<u8>, String> {
    let err = |e: std::io::Error| format!("{}: {e}", file.display());
    let mut f = std::fs::File::open(file).map_err(err)?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(err)?;
    let len = u64::from_le_bytes(len).min(64 << 20) as usize;
    let mut header = vec![0u8; len];
    f.read_exact(&mut header).map_err(err)?;
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_cross_the_wire_and_name_what_differs() {
        let a = NodeIdentity { version: "0.1.0".into(), model: "m (ab)".into(), settings: "ctx=4096".into() };
        assert_eq!(NodeIdentity::from_wire(&a.to_wire().unwrap()), Some(a.clone()));
        assert_eq!(a.mismatch(1, &a), None);
        let b = NodeIdentity { model: "n (cd)".into(), settings: "ctx=8192".into(), ..a.clone() };
        let says = a.mismatch(2, &b).unwrap();
        assert!(says.contains("model n (cd) on rank 2") && says.contains("ctx=8192"), "{says}");
        assert!(!says.contains("FastMLX"), "{says}");
    }
}
