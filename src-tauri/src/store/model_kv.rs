//! A model's own KV-cache format (`--model-kv MODEL=BITS[/GROUP[/START]]`, the Server page):
//! a 30B coder on a 32 GB Mac wants 4-bit keys and values while a small chat model beside it
//! stays exact. Models without one use the server's (`--kv-bits`).

use crate::model::cache::DEFAULT_KV_GROUP_SIZE;
use crate::model::KvFormat;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelKv {
    /// The catalog id of the model (`fastmlx ls`).
    pub model: String,
    pub format: KvFormat,
}

impl std::str::FromStr for ModelKv {
    type Err = String;

    /// `MODEL=8`, `MODEL=4/32`, `MODEL=8/64/4096`, `MODEL=off`.
    fn from_str(s: &str) -> Result<ModelKv, String> {
        let bad = || format!("{s:?}: expected MODEL=BITS[/GROUP[/START]] (BITS 8, 4 or off)");
        let (model, spec) = s.rsplit_once('=').ok_or_else(bad)?;
        let model = model.trim();
        if model.is_empty() {
            return Err(bad());
        }
        let mut parts = spec.trim().split('/');
        let bits = match parts.next().map(str::trim) {
            Some("off" | "0") => 0,
            Some(b) => b.parse().map_err(|_| bad())?,
            None => return Err(bad()),
        };
        let number = |p: Option<&str>, default: i32| p.map_or(Ok(default), |p| p.trim().parse().map_err(|_| bad()));
        let group_size = number(parts.next(), DEFAULT_KV_GROUP_SIZE)?;
        let start = number(parts.next(), 0)?;
        if parts.next().is_some() {
            return Err(bad());
        }
        let format = KvFormat::from_settings(bits, group_size, start).map_err(|e| format!("{s:?}: {e}"))?;
        Ok(ModelKv { model: model.to_string(), format })
    }
}

impl std::fmt::Display for ModelKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.format.quant {
            Some(q) => write!(f, "{}={}/{}/{}", self.model, q.bits, q.group_size, self.format.start),
            None => write!(f, "{}=off", self.model),
        }
    }
}

/// The format `model` is served with: its own, else `default`.
pub fn format_for(per_model: &[ModelKv], model: &str, default: KvFormat) -> KvFormat {
    per_model.iter().rev().find(|m| m.model == model).map_or(default, |m| m.format)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::KvQuant;

    #[test]
    fn parses_and_prints_what_it_parsed() {
        let q = |bits, group_size, start| KvFormat { quant: Some(KvQuant { bits, group_size }), start };
        let cases = [
            ("qwen3-coder=8", q(8, 64, 0)),
            ("mlx-community/Qwen3-4bit=4/32", q(4, 32, 0)),
            ("a=b=8/128/4096", q(8, 128, 4096)),
            ("small=off", KvFormat::FULL),
        ];
        for (text, format) in cases {
            let parsed: ModelKv = text.parse().unwrap();
            assert_eq!(parsed.format, format, "{text}");
            assert_eq!(parsed.to_string().parse::<ModelKv>().unwrap(), parsed, "{text} round trip");
        }
        assert_eq!("a=b=8".parse::<ModelKv>().unwrap().model, "a=b");
        for bad in ["=8", "m", "m=3", "m=8/48", "m=8/64/-1", "m=8/64/0/1", "m=eight"] {
            assert!(bad.parse::<ModelKv>().is_err(), "{bad}");
        }
        let per_model = vec!["big=4".parse().unwrap(), "small=off".parse().unwrap()];
        assert_eq!(format_for(&per_model, "big", KvFormat::FULL), q(4, 64, 0));
        assert_eq!(format_for(&per_model, "small", q(8, 64, 0)), KvFormat::FULL);
        assert_eq!(format_for(&per_model, "other", q(8, 64, 0)), q(8, 64, 0));
    }
}
