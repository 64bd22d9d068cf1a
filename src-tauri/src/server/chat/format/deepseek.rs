//! DeepSeek-V3.1 (and V3.2's and R1-0528's templates): the calls of a turn between
//! `<｜tool▁calls▁begin｜>` and `<｜tool▁calls▁end｜>`, each
//! `<｜tool▁call▁begin｜>name<｜tool▁sep｜>{json}<｜tool▁call▁end｜>`, all of them special tokens
//! of DeepSeek's vocabulary. Arguments are JSON, as vLLM's `deepseek_v31` parser reads them. Its
//! template renders no tool list: the tools are described after the system prompt as the model
//! card writes them.

use serde_json::Value;

use super::sections::{markers, SectionFormat, Sections};
use super::ChatFormat;

const SECTIONS: Sections = Sections {
    begin: "<｜tool▁calls▁begin｜>",
    end: "<｜tool▁calls▁end｜>",
    call_begin: "<｜tool▁call▁begin｜>",
    arguments: "<｜tool▁sep｜>",
    call_end: "<｜tool▁call▁end｜>",
    name_lark: super::lark::lark_string,
    rules: "",
    name_of: |name| name,
    arguments_of: |text| serde_json::from_str(text).ok(),
};

pub(super) fn detect(template: &str) -> Option<Box<dyn ChatFormat>> {
    template.contains(SECTIONS.begin).then(|| Box::new(DEEPSEEK) as Box<dyn ChatFormat>)
}

pub(super) const DEEPSEEK: SectionFormat = SectionFormat {
    name: "deepseek",
    sections: &SECTIONS,
    markers: &markers(&SECTIONS),
    parse: |body, _, _| SECTIONS.parse(body),
    tool_instructions: Some(describe_tools),
};

/// DeepSeek-V3.1's template renders no tools: its model card's description of them.
fn describe_tools(tools: &[Value]) -> String {
    let mut text = String::from("## Tools\nYou have access to the following tools:\n\n");
    for tool in tools {
        let f = tool.get("function").unwrap_or(tool);
        let field = |key: &str| f.get(key).and_then(Value::as_str).unwrap_or_default();
        let parameters = crate::tokenizer::python_json(f.get("parameters").unwrap_or(&Value::Null));
        text.push_str(&format!(
            "### {}\nDescription: {}\n\nParameters: {parameters}\n\n",
            field("name"),
            field("description")
        ));
    }
    text.push_str(TOOL_FORMAT);
    text
}

/// The model card's closing instructions, word for word.
const TOOL_FORMAT: &str = "IMPORTANT: ALWAYS adhere to this exact format for tool use:\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments<｜tool▁call▁end｜>{additional_tool_calls}<｜tool▁calls▁end｜>\n\nWhere:\n- `tool_call_name` must be an exact match to one of the available tools\n- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n- For multiple tool calls, chain them directly without separators or spaces";

#[cfg(test)]
mod tests {
    use super::super::tests::{call, read};
    use super::*;
    use crate::server::chat::piece::Piece;

    #[test]
    fn a_section_of_calls_reads_as_calls() {
        let text = "I will check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        // Cut inside markers (on character boundaries, as a detokenizer streams).
        let cuts: Vec<usize> = text.char_indices().map(|(i, _)| i).filter(|i| [16, 30, 95].contains(&(i / 4))).collect();
        let (a, b) = (cuts[0], cuts[cuts.len() - 1]);
        let out = read(&DEEPSEEK, &[&text[..a], &text[a..b], &text[b..]]);
        assert_eq!(
            out,
            vec![Piece::Text("I will check.".into()), call("get_weather", r#"{"city":"Paris"}"#), call("get_time", "{}")]
        );
        let broken = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{not json<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        assert_eq!(read(&DEEPSEEK, &[broken]), vec![Piece::Text(broken.into())], "what is not a call stays text");
    }

    /// The model card's layout, `{system prompt}\n\n{tool_description}`, as a fine-tuning
    /// library's test renders it for two tools and no system prompt.
    #[test]
    fn tools_are_described_after_the_system_prompt_as_the_model_card_writes() {
        let tools = [
            serde_json::json!({"type": "function", "function": {"name": "convert_temperature",
                "description": "Convert temperature from one unit to another", "parameters": {"type": "object",
                "properties": {"temperature": {"type": "number", "description": "The temperature value"},
                "from_unit": {"type": "string", "description": "The unit to convert from"},
                "to_unit": {"type": "string", "description": "The unit to convert to"}},
                "required": ["temperature", "from_unit", "to_unit"]}}}),
            serde_json::json!({"type": "function", "function": {"name": "get_current_date",
                "description": "Get the current date", "parameters": {}}}),
        ];
        let format = super::super::ModelFormat::of_template("<｜tool▁calls▁begin｜>{{ message['tool_calls'] }}");
        let user = serde_json::json!({"role": "user", "content": "Hi"});
        let messages = format.with_tool_instructions(vec![user.clone()], Some(&tools));
        let expected = "\n\n## Tools\nYou have access to the following tools:\n\n### convert_temperature\nDescription: Convert temperature from one unit to another\n\nParameters: {\"type\": \"object\", \"properties\": {\"temperature\": {\"type\": \"number\", \"description\": \"The temperature value\"}, \"from_unit\": {\"type\": \"string\", \"description\": \"The unit to convert from\"}, \"to_unit\": {\"type\": \"string\", \"description\": \"The unit to convert to\"}}, \"required\": [\"temperature\", \"from_unit\", \"to_unit\"]}\n\n### get_current_date\nDescription: Get the current date\n\nParameters: {}\n\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments<｜tool▁call▁end｜>{additional_tool_calls}<｜tool▁calls▁end｜>\n\nWhere:\n- `tool_call_name` must be an exact match to one of the available tools\n- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n- For multiple tool calls, chain them directly without separators or spaces";
        assert_eq!(messages, vec![serde_json::json!({"role": "system", "content": expected}), user.clone()]);
        let system = serde_json::json!({"role": "system", "content": "Be brief."});
        let messages = format.with_tool_instructions(vec![system, user.clone()], Some(&tools));
        assert_eq!(messages[0]["content"].as_str().unwrap(), format!("Be brief.{expected}"));
        let renders = super::super::ModelFormat::of_template("<｜tool▁calls▁begin｜>{{ tools }}");
        assert_eq!(renders.with_tool_instructions(vec![user.clone()], Some(&tools)), vec![user], "a template with tools");
    }
}
