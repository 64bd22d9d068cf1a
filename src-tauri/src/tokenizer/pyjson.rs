//! `tojson` as Hugging Face templates expect it: Python's `json.dumps(x, ensure_ascii=False,
//! indent=..., separators=..., sort_keys=...)`, not minijinja's HTML-safe compact JSON. The
//! spacing matters: tool definitions are rendered into the prompt the model was trained on.

use minijinja::value::{Value, ValueKind};

pub struct PyJsonOptions {
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
}

impl PyJsonOptions {
    /// Python's defaults: `", "` and `": "` without indent, `","` and `": "` with one.
    pub fn new(indent: Option<String>) -> PyJsonOptions {
        let item_separator = if indent.is_some() { "," } else { ", " }.to_string();
        PyJsonOptions { indent, item_separator, key_separator: ": ".to_string(), sort_keys: false }
    }
}

pub fn dumps(value: &Value, options: &PyJsonOptions) -> Result<String, minijinja::Error> {
    let mut out = String::new();
    write_value(&mut out, value, options, 0)?;
    Ok(out)
}

fn newline(out: &mut String, options: &PyJsonOptions, depth: usize) {
    if let Some(indent) = &options.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

fn write_value(out: &mut String, value: &Value, options: &PyJsonOptions, depth: usize) -> Result<(), minijinja::Error> {
    match value.kind() {
        // json.dumps cannot write jinja2's Undefined: transformers' renders fail there too.
        ValueKind::Undefined => {
            return Err(minijinja::Error::new(
                minijinja::ErrorKind::UndefinedError,
                "tojson: the value is undefined (Object of type Undefined is not JSON serializable)",
            ))
        }
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::String => {
            out.push_str(&serde_json::to_string(value.as_str().unwrap_or_default()).unwrap_or_default())
        }
        ValueKind::Number => {
            let json = serde_json::to_value(value)
                .map_err(|e| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string()))?;
            out.push_str(&json.to_string());
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&options.item_separator);
                }
                newline(out, options, depth + 1);
                write_value(out, item, options, depth + 1)?;
            }
            newline(out, options, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if options.sort_keys {
                keys.sort_by_key(|k| k.to_string());
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&options.item_separator);
                }
                newline(out, options, depth + 1);
                let key_text = match key.as_str() {
                    Some(s) => s.to_string(),
                    None => key.to_string(),
                };
                out.push_str(&serde_json::to_string(&key_text).unwrap_or_default());
                out.push_str(&options.key_separator);
                write_value(out, &value.get_item(key)?, options, depth + 1)?;
            }
            newline(out, options, depth);
            out.push('}');
        }
        _ => out.push_str(&serde_json::to_string(&value.to_string()).unwrap_or_default()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(json: &str, indent: Option<&str>) -> String {
        let value = Value::from_serialize(serde_json::from_str::<serde_json::Value>(json).unwrap());
        dumps(&value, &PyJsonOptions::new(indent.map(str::to_string))).unwrap()
    }

    #[test]
    fn matches_python_json_dumps_spacing_and_order() {
        // json.dumps({"b": 1, "a": [1.5, "x\"y", None, True]}, ensure_ascii=False)
        assert_eq!(
            render(r#"{"b":1,"a":[1.5,"x\"y",null,true]}"#, None),
            r#"{"b": 1, "a": [1.5, "x\"y", null, true]}"#
        );
    }

    #[test]
    fn keeps_non_ascii_and_indents_like_python() {
        // json.dumps({"k": "Grüße 世界", "e": {}}, ensure_ascii=False, indent=2)
        assert_eq!(render(r#"{"k":"Grüße 世界","e":{}}"#, Some("  ")), "{\n  \"k\": \"Grüße 世界\",\n  \"e\": {}\n}");
    }
}
