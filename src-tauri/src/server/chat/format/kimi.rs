//! Kimi K2: the calls of a turn between `<|tool_calls_section_begin|>` and
//! `<|tool_calls_section_end|>`, each `<|tool_call_begin|>functions.name:index
//! <|tool_call_argument_begin|>{json}<|tool_call_end|>` (special tokens of Kimi's vocabulary; the
//! index counts the calls of the conversation). Arguments are JSON, or a Python literal as mlx-lm's
//! `kimi_k2` parser also reads.

use serde_json::Value;

use super::sections::{markers, SectionFormat, Sections};
use super::ChatFormat;

const SECTIONS: Sections = Sections {
    begin: "<|tool_calls_section_begin|>",
    end: "<|tool_calls_section_end|>",
    call_begin: "<|tool_call_begin|>",
    arguments: "<|tool_call_argument_begin|>",
    call_end: "<|tool_call_end|>",
    name_lark: |name| format!("{} INDEX", super::lark::lark_string(&format!("functions.{name}:"))),
    rules: "INDEX: /[0-9]{1,4}/\n",
    // `functions.name:0` (or a bare `name:0`).
    name_of: |id| {
        let name = id.rsplit_once(':').map_or(id, |(name, _)| name);
        name.strip_prefix("functions.").unwrap_or(name)
    },
    arguments_of,
};

pub(super) fn detect(template: &str) -> Option<Box<dyn ChatFormat>> {
    template.contains(SECTIONS.begin).then(|| Box::new(KIMI) as Box<dyn ChatFormat>)
}

pub(super) const KIMI: SectionFormat = SectionFormat {
    name: "kimi",
    sections: &SECTIONS,
    markers: &markers(&SECTIONS),
    parse: |body, _, _| SECTIONS.parse(body),
    tool_instructions: None,
};

/// JSON arguments, or Python's `True` / `False` / `None` and quotes where JSON has its own.
fn arguments_of(text: &str) -> Option<Value> {
    serde_json::from_str(text).ok().or_else(|| {
        let json = text.replace("True", "true").replace("False", "false").replace("None", "null").replace('\'', "\"");
        serde_json::from_str(&json).ok()
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{call, read};
    use super::*;
    use crate::server::chat::piece::Piece;

    #[test]
    fn a_section_of_calls_reads_as_calls() {
        let text = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{'zone': 'UTC', 'dst': True}<|tool_call_end|><|tool_calls_section_end|>";
        let out = read(&KIMI, &[&text[..40], &text[40..]]);
        assert_eq!(out, vec![call("get_weather", r#"{"city":"Paris"}"#), call("get_time", r#"{"zone":"UTC","dst":true}"#)]);
        let cut = "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0";
        assert_eq!(read(&KIMI, &[cut]), vec![Piece::Text(cut.into())]);
    }
}
