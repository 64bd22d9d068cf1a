//! Jinja2's `string` filter as Hugging Face templates get it: Python's `str(x)`, so a dict or a
//! list prints as Python writes it (`{'name': 'f', 'ok': True}`), not as minijinja's JSON-like
//! text. SmolLM3's template writes its tool list so.

use minijinja::value::{Value, ValueKind};

/// `str(value)`: a string as it is, anything else as [`repr`] writes it (`None`, `True`, `2.5`).
pub fn string(value: &Value) -> Result<String, minijinja::Error> {
    match value.kind() {
        ValueKind::String => Ok(value.as_str().unwrap_or_default().to_string()),
        // Jinja2's Undefined prints as nothing.
        ValueKind::Undefined => Ok(String::new()),
        _ => repr(value),
    }
}

/// Python's `repr(value)` for what JSON can hold.
pub fn repr(value: &Value) -> Result<String, minijinja::Error> {
    let mut out = String::new();
    write_repr(&mut out, value)?;
    Ok(out)
}

fn write_repr(out: &mut String, value: &Value) -> Result<(), minijinja::Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::String => quote(out, value.as_str().unwrap_or_default()),
        ValueKind::Number => {
            let json = serde_json::to_value(value)
                .map_err(|e| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string()))?;
            out.push_str(&json.to_string());
        }
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &item)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &key)?;
                out.push_str(": ");
                write_repr(out, &value.get_item(&key)?)?;
            }
            out.push('}');
        }
        _ => out.push_str(&value.to_string()),
    }
    Ok(())
}

/// A string as Python quotes it: single quotes unless it holds one and no double quote.
fn quote(out: &mut String, s: &str) {
    let q = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(q);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_print_as_python_prints_them() {
        let v = Value::from_serialize(serde_json::json!({
            "name": "f", "ok": true, "none": null, "n": [1, 2.5, "it's"], "q": "say \"hi\" 'x'\n", "ü": "°C"
        }));
        assert_eq!(
            string(&v).unwrap(),
            r#"{'name': 'f', 'ok': True, 'none': None, 'n': [1, 2.5, "it's"], 'q': 'say "hi" \'x\'\n', 'ü': '°C'}"#
        );
        assert_eq!(string(&Value::from("plain")).unwrap(), "plain");
        assert_eq!(string(&Value::from(true)).unwrap(), "True");
    }
}
