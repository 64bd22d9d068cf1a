//! The arguments of a named call written in the model's own format (`tool_choice` naming a
//! function), streamed as they are generated: the JSON value after the format's key
//! (`"arguments"`, Llama's `"parameters"`, Mistral's `[ARGS]`), read to its closing bracket.
//! What comes before and after it (the format's markers, the name) is not passed on.

pub struct NamedArguments {
    key: String,
    state: State,
}

enum State {
    /// Text so far, until the key (and for a JSON key its colon) and the value's first
    /// character are in it.
    Seeking(String),
    Value {
        depth: usize,
        in_string: bool,
        escaped: bool,
    },
    Done,
}

impl NamedArguments {
    pub fn new(key: &str) -> NamedArguments {
        NamedArguments { key: key.to_string(), state: State::Seeking(String::new()) }
    }

    /// The arguments' text within `text`.
    pub fn push(&mut self, text: &str) -> String {
        let mut out = String::new();
        let pending = match &mut self.state {
            State::Seeking(head) => {
                head.push_str(text);
                let Some(start) = value_start(head, &self.key) else { return out };
                let value = head[start..].to_string();
                self.state = State::Value { depth: 0, in_string: false, escaped: false };
                value
            }
            State::Value { .. } => text.to_string(),
            State::Done => return out,
        };
        for c in pending.chars() {
            let State::Value { depth, in_string, escaped } = &mut self.state else { break };
            out.push(c);
            match (*in_string, *escaped, c) {
                (true, true, _) => *escaped = false,
                (true, false, '\\') => *escaped = true,
                (true, false, '"') => *in_string = false,
                (true, false, _) => {}
                (false, _, '"') => *in_string = true,
                (false, _, '{' | '[') => *depth += 1,
                (false, _, '}' | ']') => {
                    *depth = depth.saturating_sub(1);
                    if *depth == 0 {
                        self.state = State::Done;
                    }
                }
                _ => {}
            }
        }
        out
    }
}

/// Where the value after `key` starts in `head`, once its first character is there. A JSON key
/// is followed by a colon (which tells it from a name of the same text, followed by a comma).
fn value_start(head: &str, key: &str) -> Option<usize> {
    for (at, _) in head.match_indices(key) {
        let mut rest = &head[at + key.len()..];
        if key.starts_with('"') {
            match rest.trim_start().strip_prefix(':') {
                Some(after) => rest = after,
                None => continue,
            }
        }
        let value = rest.trim_start();
        if !value.is_empty() {
            return Some(head.len() - value.len());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streamed(key: &str, text: &str, chunk: usize) -> String {
        let mut arguments = NamedArguments::new(key);
        let chars: Vec<char> = text.chars().collect();
        chars.chunks(chunk).map(|c| arguments.push(&c.iter().collect::<String>())).collect()
    }

    #[test]
    fn the_value_after_the_key_in_any_chunking() {
        let cases = [
            (
                "\"arguments\"",
                "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"}]\\\"\", \"b\": [1, {}]}}\n</tool_call>",
            ),
            ("\"arguments\"", "[TOOL_CALLS] [{\"name\":\"arguments\",\"arguments\" :{\"a\": \"é\"}}]"),
            ("\"parameters\"", "{\"name\": \"f\", \"parameters\": {\"a\": 1}}"),
            ("[ARGS]", "[TOOL_CALLS]f[ARGS]{\"a\": 1}"),
        ];
        let expected = [r#"{"a": "}]\"", "b": [1, {}]}"#, r#"{"a": "é"}"#, r#"{"a": 1}"#, r#"{"a": 1}"#];
        for ((key, text), want) in cases.iter().zip(expected) {
            for chunk in [1, 2, 3, 7, 1000] {
                assert_eq!(streamed(key, text, chunk), want, "{text} in chunks of {chunk}");
            }
        }
    }

    #[test]
    fn nothing_before_the_key() {
        assert_eq!(streamed("\"arguments\"", "{\"name\": \"f\", \"argu", 3), "");
    }
}
