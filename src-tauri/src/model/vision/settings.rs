//! Reading a checkpoint's processor files as the reference processors read them: the keys of
//! `preprocessor_config.json`, overridden by `processor_config.json`'s `image_processor`, each
//! checked for its kind.

use serde_json::Value;

/// `preprocessor_config.json`'s keys with `processor_config.json`'s `image_processor` over them
/// (either file may be absent: `Null`).
pub(super) fn processor_keys(preprocessor: &Value, processor: &Value) -> Value {
    let mut raw = preprocessor.as_object().cloned().unwrap_or_default();
    if let Some(over) = processor.get("image_processor").and_then(Value::as_object) {
        raw.extend(over.clone());
    }
    Value::Object(raw)
}

/// A positive integer at `key` of `raw`, or `None` when absent.
pub(super) fn uint(raw: &Value, key: &str) -> Result<Option<usize>, String> {
    match raw.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|n| *n > 0)
            .map(|n| Some(n as usize))
            .ok_or(format!("{key} must be a positive integer: {v}")),
    }
}

/// Three numbers at `key` of `raw` (a mean or a deviation per channel), or `None` when absent.
pub(super) fn three(raw: &Value, key: &str) -> Result<Option<[f32; 3]>, String> {
    match raw.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(v)) if v.len() == 3 && v.iter().all(Value::is_number) => {
            Ok(Some([0, 1, 2].map(|i| v[i].as_f64().unwrap_or_default() as f32)))
        }
        Some(v) => Err(format!("{key} must be three numbers: {v}")),
    }
}
