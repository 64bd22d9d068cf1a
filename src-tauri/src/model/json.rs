//! JSON as model folders carry it: Python's `json` writes non-finite floats as bare
//! `Infinity` / `NaN` (not JSON), transformers and mlx-lm as `{"__float__": "Infinity"}`.

use serde_json::Value;

/// JSON as Python's `json` writes it: bare `Infinity`, `-Infinity` and `NaN` (Mamba-2 configs'
/// `time_step_limit`) are read as the strings `"Infinity"`, `"-Infinity"` and `"NaN"`, which
/// the fields that take them accept (as they accept mlx-lm's `{"__float__": "Infinity"}`).
pub fn parse_json(text: &str) -> serde_json::Result<Value> {
    serde_json::from_str(text).or_else(|e| match quote_bare_floats(text) {
        Some(quoted) => serde_json::from_str(&quoted),
        None => Err(e),
    })
}

/// `text` with its bare non-finite numbers quoted (outside strings); `None` if it has none.
fn quote_bare_floats(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len() + 16);
    let (mut in_string, mut escaped, mut changed) = (false, false, false);
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
        } else if let Some(word) = ["-Infinity", "Infinity", "NaN"].into_iter().find(|w| rest.starts_with(w)) {
            out.push('"');
            out.push_str(word);
            out.push('"');
            rest = &rest[word.len()..];
            changed = true;
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    changed.then_some(out)
}

/// A float field that may be non-finite: a number, `"Infinity"` / `"-Infinity"` / `"NaN"` (as
/// [`parse_json`] reads Python's bare words), or mlx-lm's `{"__float__": "Infinity"}`.
pub fn json_float(value: &Value) -> Option<f64> {
    let word = |w: &str| match w {
        "Infinity" | "inf" => Some(f64::INFINITY),
        "-Infinity" | "-inf" => Some(f64::NEG_INFINITY),
        "NaN" | "nan" => Some(f64::NAN),
        _ => w.parse().ok(),
    };
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(w) => word(w),
        Value::Object(o) => o.get("__float__").and_then(Value::as_str).and_then(word),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_non_finite_numbers_read_as_their_words_and_strings_stay_as_they_are() {
        let text = r#"{"limit": [0.0, Infinity], "low": -Infinity, "x": NaN, "note": "Infinity \"NaN\" here", "n": 1}"#;
        assert!(serde_json::from_str::<Value>(text).is_err());
        let v = parse_json(text).unwrap();
        assert_eq!(v["limit"][1], "Infinity");
        assert_eq!(v["note"], "Infinity \"NaN\" here", "inside a string nothing changes");
        assert_eq!(json_float(&v["limit"][1]), Some(f64::INFINITY));
        assert_eq!(json_float(&v["low"]), Some(f64::NEG_INFINITY));
        assert!(json_float(&v["x"]).unwrap().is_nan());
        assert_eq!(json_float(&serde_json::json!({"__float__": "-Infinity"})), Some(f64::NEG_INFINITY));
        assert_eq!(json_float(&v["n"]), Some(1.0));
        // Not JSON for other reasons: the first error is kept.
        let err = parse_json("{\"a\": }").unwrap_err().to_string();
        assert!(err.contains("expected value"), "{err}");
    }
}
