//! Forced tool calls in the model's own format: when `tool_choice` is `required` or names a
//! function, the answer is held to a Lark grammar of the calls exactly as the model's template
//! trains it to write them (Hermes `<tool_call>` JSON, Mistral `[TOOL_CALLS]`, Llama 3 JSON,
//! Qwen3-Coder's XML), so the tokens it is made to write are the ones it would pick, and the
//! format's own parser reads them. Formats without a grammar here fall back to plain JSON.

use serde_json::{json, Value};

use super::tool_calls::ToolFormat;
use crate::constrain::{Grammar, SchemaError};

/// A function the model may be made to call.
pub struct Function {
    pub name: String,
    pub parameters: Value,
}

/// The grammar of the forced calls, and for one named function the text its JSON arguments
/// follow (a key, or Mistral's `[ARGS]`), to stream them as they come; `None` when the
/// format's arguments are not JSON (Qwen's XML: they are read when the call is complete).
pub struct ForcedCalls {
    pub grammar: Grammar,
    pub arguments_after: Option<String>,
}

/// `special`: a special token's id, by its text (the grammar names it by id; a marker that is
/// not a special token of the vocabulary is written as text).
pub fn forced_calls(
    format: ToolFormat,
    template_source: &str,
    functions: &[&Function],
    named: bool,
    parallel: bool,
    special: &dyn Fn(&str) -> Option<u32>,
) -> Option<Result<ForcedCalls, SchemaError>> {
    if matches!(format, ToolFormat::Harmony | ToolFormat::Gemma4 | ToolFormat::Pythonic) {
        return None;
    }
    let build = || -> Result<String, SchemaError> {
        if format == ToolFormat::LlamaJson {
            // Llama 3.1-3.3 with custom tools: a bare JSON object, `parameters` for the arguments.
            let call = json_rule(&call_objects(functions, "parameters"))?;
            let start = if parallel { format!("call ({} call)*", lark_string("; ")) } else { "call".into() };
            return Ok(format!("start: {start}\ncall: {call}\n"));
        }
        let syntax = call_syntax(format, template_source, functions, parallel, special)?;
        let more = syntax.more(parallel);
        Ok(format!("start: call {more}\ncall: {} {}\n{}", syntax.open_lark, syntax.body, syntax.rules))
    };
    // A named function's JSON arguments follow this key (its value is read as it streams).
    let arguments_after = match format {
        _ if !named => None,
        ToolFormat::Hermes => Some("\"arguments\""),
        ToolFormat::Mistral if template_source.contains("[ARGS]") => Some("[ARGS]"),
        ToolFormat::Mistral => Some("\"arguments\""),
        ToolFormat::LlamaJson => Some("\"parameters\""),
        _ => None,
    };
    Some(build().and_then(|lark| {
        Grammar::from_lark(lark, true)
            .map(|grammar| ForcedCalls { grammar, arguments_after: arguments_after.map(str::to_string) })
    }))
}

/// With `tool_choice: "auto"` and `--strict-tools`: free text, but once the model opens a call
/// the rest must be calls of the offered functions that parse. `None` for formats without it
/// (a Llama call is a bare JSON answer; Harmony, Gemma 4 and LFM2 have no grammar here).
pub fn strict_auto_calls(
    format: ToolFormat,
    template_source: &str,
    functions: &[&Function],
    parallel: bool,
    special: &dyn Fn(&str) -> Option<u32>,
) -> Option<Result<Grammar, SchemaError>> {
    if !matches!(format, ToolFormat::Hermes | ToolFormat::Mistral | ToolFormat::QwenXml) {
        return None;
    }
    let build = || -> Result<String, SchemaError> {
        let syntax = call_syntax(format, template_source, functions, parallel, special)?;
        let more = syntax.more(parallel);
        let calls = format!("call: {} {}\n{}", syntax.open_lark, syntax.body, syntax.rules);
        Ok(match &syntax.open_text {
            // A text marker: the free text is one lexeme up to its first appearance, or all of
            // the answer (a lexeme ends only where it cannot go on, so the marker is inside it).
            Some(open) => {
                let open = regex_text(open);
                format!(
                    "start: FREE | OPENED {} {more}\n{calls}\nFREE: /(?s:.*)/ & ~/(?s:.*){open}(?s:.*)/\nOPENED: /(?s:.*){open}/ & ~/(?s:.*){open}(?s:.+)/\n",
                    syntax.body
                )
            }
            // A special token: text cannot hold it.
            None => format!("start: FREE? | FREE? call {more}\n{calls}\nFREE: /(?s:.+)/\n"),
        })
    };
    Some(build().and_then(|lark| Grammar::from_lark(lark, false)))
}

/// A format's calls in Lark: the marker that opens one, what follows it, what may separate two.
struct CallSyntax {
    open_lark: String,
    /// The opening marker when it is text (not a special token of the vocabulary).
    open_text: Option<String>,
    body: String,
    /// A Lark expression (`None`: a second call cannot follow).
    separator: Option<String>,
    /// Rules the body refers to.
    rules: String,
}

impl CallSyntax {
    /// What may follow the first call.
    fn more(&self, parallel: bool) -> String {
        match (&self.separator, parallel) {
            (Some(separator), true) => format!("({separator} call)*"),
            _ => String::new(),
        }
    }
}

fn call_syntax(
    format: ToolFormat,
    template_source: &str,
    functions: &[&Function],
    parallel: bool,
    special: &dyn Fn(&str) -> Option<u32>,
) -> Result<CallSyntax, SchemaError> {
    let marker = |text: &str| marker_lark(special, text);
    let text_open = |text: &str| (marker(text).starts_with('"')).then(|| text.to_string());
    Ok(match format {
        ToolFormat::Hermes => CallSyntax {
            open_lark: lark_string("<tool_call>"),
            open_text: Some("<tool_call>".into()),
            body: format!(
                "{} {} {}",
                lark_string("\n"),
                json_rule(&call_objects(functions, "arguments"))?,
                lark_string("\n</tool_call>")
            ),
            separator: Some(lark_string("\n")),
            rules: String::new(),
        },
        ToolFormat::Mistral if template_source.contains("[ARGS]") => {
            // Mistral Small 3.2, Devstral, Magistral: `[TOOL_CALLS]name[ARGS]{...}` per call.
            let alternatives = functions
                .iter()
                .map(|f| Ok(format!("{} {} {}", lark_string(&f.name), marker("[ARGS]"), json_rule(&f.parameters)?)))
                .collect::<Result<Vec<String>, SchemaError>>()?;
            CallSyntax {
                open_lark: marker("[TOOL_CALLS]"),
                open_text: text_open("[TOOL_CALLS]"),
                body: format!("({})", alternatives.join(" | ")),
                separator: Some(String::new()),
                rules: String::new(),
            }
        }
        ToolFormat::Mistral => {
            // Older Mistral templates: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}]`, an
            // `"id"` after the arguments as the template writes calls in the history.
            let mut items = call_objects(functions, "arguments");
            let alternatives = match items.get_mut("anyOf") {
                Some(Value::Array(list)) => list.iter_mut().collect::<Vec<_>>(),
                _ => vec![&mut items],
            };
            for call in alternatives {
                call["properties"]["id"] = json!({"type": "string", "pattern": "^[A-Za-z0-9]{9}$"});
            }
            let mut list = json!({"type": "array", "items": items, "minItems": 1});
            if !parallel {
                list["maxItems"] = json!(1);
            }
            CallSyntax {
                open_lark: marker("[TOOL_CALLS]"),
                open_text: text_open("[TOOL_CALLS]"),
                body: format!("{}? {}", lark_string(" "), json_rule(&list)?),
                separator: None,
                rules: String::new(),
            }
        }
        ToolFormat::QwenXml => {
            let (body, rules) = qwen_xml(functions)?;
            CallSyntax {
                open_lark: lark_string("<tool_call>"),
                open_text: Some("<tool_call>".into()),
                body,
                separator: Some(r#""\n"?"#.into()),
                rules,
            }
        }
        ToolFormat::LlamaJson | ToolFormat::Harmony | ToolFormat::Gemma4 | ToolFormat::Pythonic => {
            unreachable!("no call syntax for {format:?}")
        }
    })
}

/// A format's marker in Lark: by id when it is a special token of the vocabulary, else as text.
fn marker_lark(special: &dyn Fn(&str) -> Option<u32>, text: &str) -> String {
    special(text).map_or_else(|| lark_string(text), |id| format!("<[{id}]>"))
}

/// Text matched literally in a Lark regular expression.
fn regex_text(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c.to_string() } else { format!("\\x{:02x}", c as u32) })
        .collect()
}

/// Qwen3-Coder / Qwen3.5: `<tool_call>\n<function=name>\n<parameter=key>\nvalue\n</parameter>\n
/// </function>\n</tool_call>`, the newlines between tags optional (as Qwen's own parser reads
/// it). A string's value is raw text (anything up to the closing tag, within its length
/// bounds; or one of its `enum`); other values are JSON of their schema. Properties in the
/// schema's order, required ones present.
fn qwen_xml(functions: &[&Function]) -> Result<(String, String), SchemaError> {
    const NL: &str = r#""\n"?"#;
    const CLOSE: &str = r#""</parameter>""#;
    let mut rules = Vec::new();
    let mut alternatives = Vec::new();
    for (i, f) in functions.iter().enumerate() {
        let required: Vec<&str> = f
            .parameters
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut parts = Vec::new();
        if let Some(properties) = f.parameters.get("properties").and_then(Value::as_object) {
            for (j, (key, schema)) in properties.iter().enumerate() {
                let value = match (schema.get("type").and_then(Value::as_str), schema.get("enum")) {
                    (Some("string"), Some(Value::Array(values))) => {
                        let raw: Vec<String> = values.iter().filter_map(Value::as_str).map(lark_string).collect();
                        format!("{NL} ({}) {NL} {CLOSE}", raw.join(" | "))
                    }
                    (Some("string"), _) => {
                        // The text and its closing tag are one lexeme, which ends at the tag's
                        // first appearance (a lexeme ends only where it cannot go on).
                        let terminal = format!("F{i}_P{j}");
                        let bound = |key: &str| schema.get(key).and_then(Value::as_u64);
                        let length = match (bound("minLength"), bound("maxLength")) {
                            (None, None) => "*".to_string(),
                            (min, max) => {
                                format!("{{{},{}}}", min.unwrap_or(0), max.map(|m| m.to_string()).unwrap_or_default())
                            }
                        };
                        rules.push(format!(
                            r"{terminal}: /\n?(?s:.{length})\n?<\/parameter>/ & ~/(?s:.*)<\/parameter>(?s:.+)/"
                        ));
                        terminal
                    }
                    _ => format!("{NL} {} {NL} {CLOSE}", json_rule(schema)?),
                };
                let rule = format!("f{i}_p{j}");
                rules.push(format!("{rule}: {} {value} {NL}", lark_string(&format!("<parameter={key}>"))));
                parts.push(if required.contains(&key.as_str()) { rule } else { format!("{rule}?") });
            }
        }
        rules.push(format!(
            "f{i}: {} {NL} {} {}",
            lark_string(&format!("<function={}>", f.name)),
            parts.join(" "),
            lark_string("</function>")
        ));
        alternatives.push(format!("f{i}"));
    }
    let body = format!("{NL} ({}) {NL} {}", alternatives.join(" | "), lark_string("</tool_call>"));
    Ok((body, format!("{}\n", rules.join("\n"))))
}

/// `{"name": <const>, "<arguments key>": <parameters>}` for each function, as one schema.
fn call_objects(functions: &[&Function], arguments_key: &str) -> Value {
    let alternatives: Vec<Value> = functions
        .iter()
        .map(|f| {
            json!({"type": "object", "properties": {"name": {"const": f.name}, arguments_key: f.parameters},
                   "required": ["name", arguments_key], "additionalProperties": false})
        })
        .collect();
    match <[Value; 1]>::try_from(alternatives) {
        Ok([one]) => one,
        Err(many) => json!({"anyOf": many}),
    }
}

/// A schema inside a Lark grammar, read as [`Grammar::from_schema`] reads it.
fn json_rule(schema: &Value) -> Result<String, SchemaError> {
    Ok(format!("%json {}", Grammar::strict_schema(schema)?))
}

/// A Lark string literal (Lark takes JSON's string syntax).
fn lark_string(text: &str) -> String {
    Value::String(text.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::constrain::{TokenConstraint, Vocabulary};
    use crate::sampling::Rng;
    use crate::server::chat::tool_calls::{parameter_schemas, Piece, ToolCall, ToolCallParser};

    const SPECIAL: [&str; 3] = ["[TOOL_CALLS]", "[ARGS]", "<|python_tag|>"];
    const HERMES: &str = "{% if tools %}<tool_call>{% endif %}";
    const MISTRAL_V11: &str = "[TOOL_CALLS]{{ name }}[ARGS]";
    const MISTRAL_V3: &str = "{{- \"[TOOL_CALLS] [\" }}";
    const LLAMA: &str = "\"parameters\"";
    const QWEN_XML: &str = "<function=x><parameter=y>";

    fn functions() -> Vec<Function> {
        vec![
            Function {
                name: "get_weather".into(),
                parameters: json!({"type": "object", "properties": {
                    "city": {"type": "string", "enum": ["Paris", "Oslo"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city"]}),
            },
            Function {
                name: "get_time".into(),
                parameters: json!({"type": "object", "properties": {"zone": {"type": "string", "maxLength": 4}},
                                   "required": ["zone"]}),
            },
        ]
    }

    fn tools() -> Vec<Value> {
        functions()
            .iter()
            .map(|f| json!({"type": "function", "function": {"name": f.name, "parameters": f.parameters}}))
            .collect()
    }

    fn vocabulary() -> Arc<Vocabulary> {
        Arc::new(Vocabulary::of_bytes(&SPECIAL))
    }

    /// The special tokens by id, as the server finds them in the model's vocabulary.
    fn special(text: &str) -> Option<u32> {
        SPECIAL.iter().position(|s| *s == text).map(|i| 256 + i as u32)
    }

    fn token_text(token: u32) -> Vec<u8> {
        match token {
            0..=255 => vec![token as u8],
            _ => SPECIAL[token as usize - 256].as_bytes().to_vec(),
        }
    }

    fn grammar(format: ToolFormat, template: &str, named: bool, parallel: bool) -> ForcedCalls {
        let functions = functions();
        let chosen: Vec<&Function> = if named { vec![&functions[0]] } else { functions.iter().collect() };
        forced_calls(format, template, &chosen, named, parallel, &special).expect("a grammar here").unwrap()
    }

    /// Whether `text` (special tokens written as themselves) is a whole answer of the grammar.
    fn accepts(forced: &ForcedCalls, text: &str) -> bool {
        let mut c = TokenConstraint::new(&forced.grammar, vocabulary()).unwrap();
        let mut rest = text;
        while !rest.is_empty() {
            let token = match SPECIAL.iter().position(|s| rest.starts_with(s)) {
                Some(i) => {
                    rest = &rest[SPECIAL[i].len()..];
                    256 + i as u32
                }
                None => {
                    let b = rest.as_bytes()[0];
                    rest = &rest[1..];
                    b as u32
                }
            };
            if !c.advance(token) {
                return false;
            }
        }
        c.is_complete()
    }

    /// An answer drawn at random from the grammar (masks over the whole vocabulary, a pull
    /// towards closing brackets so that answers end).
    fn walk(forced: &ForcedCalls, rng: &mut Rng) -> Option<String> {
        let mut c = TokenConstraint::new(&forced.grammar, vocabulary()).unwrap();
        let mut out = Vec::new();
        for _ in 0..600 {
            let mut logits = vec![0.0f32; 256 + SPECIAL.len() + 1];
            for b in b"}]\">\n" {
                logits[*b as usize] = 1.0;
            }
            assert!(c.mask(&mut logits) > 0, "a dead end after {:?}", String::from_utf8_lossy(&out));
            let allowed: Vec<u32> =
                (0..logits.len() as u32).filter(|&t| logits[t as usize] > f32::NEG_INFINITY).collect();
            let closing: Vec<u32> = allowed.iter().copied().filter(|&t| logits[t as usize] > 0.0).collect();
            let pool = if !closing.is_empty() && rng.next_f64() < 0.3 { &closing } else { &allowed };
            let token = pool[(rng.next_u64() % pool.len() as u64) as usize];
            if token as usize == logits.len() - 1 {
                return Some(String::from_utf8(out).expect("UTF-8"));
            }
            assert!(c.advance(token));
            out.extend(token_text(token));
        }
        None
    }

    fn parse(format: ToolFormat, text: &str) -> Vec<ToolCall> {
        let mut parser = ToolCallParser::new(format).with_schemas(parameter_schemas(&tools()));
        let mut pieces = parser.push(text);
        pieces.extend(parser.finish());
        pieces
            .into_iter()
            .map(|p| match p {
                Piece::Call(call) => call,
                Piece::Text(t) => panic!("{format:?}: text {t:?} beside the calls in {text:?}"),
            })
            .collect()
    }

    fn formats() -> [(ToolFormat, &'static str); 5] {
        [
            (ToolFormat::Hermes, HERMES),
            (ToolFormat::Mistral, MISTRAL_V11),
            (ToolFormat::Mistral, MISTRAL_V3),
            (ToolFormat::LlamaJson, LLAMA),
            (ToolFormat::QwenXml, QWEN_XML),
        ]
    }

    #[test]
    fn the_calls_models_write_are_what_the_grammars_allow() {
        let natural = [
            (ToolFormat::Hermes, HERMES, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>"),
            (ToolFormat::Mistral, MISTRAL_V11, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"days\": 3}"),
            (ToolFormat::Mistral, MISTRAL_V3, "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}]"),
            (ToolFormat::Mistral, MISTRAL_V3, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}, \"id\": \"a1B2c3D4e\"}]"),
            (ToolFormat::LlamaJson, LLAMA, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 3}}"),
            (ToolFormat::QwenXml, QWEN_XML, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"),
            (ToolFormat::QwenXml, QWEN_XML, "<tool_call><function=get_weather><parameter=city>Paris</parameter><parameter=days>3</parameter></function></tool_call>"),
        ];
        for (format, template, text) in natural {
            // A named call's text around its arguments is fixed (Mistral's: no `"id"`).
            let named_too = !text.contains("\"id\"");
            for named in [true, false].into_iter().filter(|&n| named_too || !n) {
                assert!(accepts(&grammar(format, template, named, true), text), "{format:?} named={named}: {text}");
            }
            let calls = parse(format, text);
            assert_eq!(calls.len(), 1, "{format:?}");
            assert_eq!(
                serde_json::from_str::<Value>(&calls[0].arguments).unwrap(),
                json!({"city": "Paris", "days": 3})
            );
            // Not an answer: a function that is not offered, or plain text.
            let other = text.replace("get_weather", "get_news");
            assert!(!accepts(&grammar(format, template, false, true), &other), "{format:?}: {other}");
            assert!(!accepts(&grammar(format, template, false, true), "It is sunny."), "{format:?}");
        }
    }

    #[test]
    fn xml_string_values_are_any_text_up_to_the_closing_tag() {
        let run = Function {
            name: "run".into(),
            parameters: json!({"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}),
        };
        let forced = forced_calls(ToolFormat::QwenXml, QWEN_XML, &[&run], true, false, &special).unwrap().unwrap();
        let code = "if a < b:\n    print(\"</p> <parameter=x>\")";
        let text =
            format!("<tool_call>\n<function=run>\n<parameter=code>\n{code}\n</parameter>\n</function>\n</tool_call>");
        assert!(accepts(&forced, &text), "{text}");
        let mut parser = ToolCallParser::new(ToolFormat::QwenXml);
        let mut pieces = parser.push(&text);
        pieces.extend(parser.finish());
        let [Piece::Call(call)] = pieces.as_slice() else { panic!("{pieces:?}") };
        assert_eq!(serde_json::from_str::<Value>(&call.arguments).unwrap(), json!({"code": code}));
        let twice = text.replace("</parameter>\n</function>", "</parameter></parameter>\n</function>");
        assert!(!accepts(&forced, &twice), "the value ends at the first closing tag");
    }

    #[test]
    fn a_named_calls_json_arguments_follow_a_known_key() {
        for (format, template) in formats() {
            let forced = grammar(format, template, true, false);
            let Some(key) = &forced.arguments_after else {
                assert_eq!(format, ToolFormat::QwenXml, "only the XML format's arguments are not JSON");
                continue;
            };
            assert!(["\"arguments\"", "\"parameters\"", "[ARGS]"].contains(&key.as_str()), "{format:?}: {key}");
        }
    }

    /// Random answers of each format's grammar read back, with the format's own parser, as calls
    /// of the offered functions whose arguments validate against their schemas.
    #[test]
    fn random_answers_parse_as_valid_calls() {
        let validators: Vec<(String, jsonschema::Validator)> =
            functions().iter().map(|f| (f.name.clone(), jsonschema::validator_for(&f.parameters).unwrap())).collect();
        let mut rng = Rng::seeded(5);
        for (format, template) in formats() {
            for (named, parallel) in [(true, false), (false, false), (false, true)] {
                let forced = grammar(format, template, named, parallel);
                let mut complete = 0;
                for _ in 0..12 {
                    let Some(text) = walk(&forced, &mut rng) else { continue };
                    complete += 1;
                    let calls = parse(format, &text);
                    assert!(!calls.is_empty() && (parallel || calls.len() == 1), "{format:?}: {text:?}");
                    for call in calls {
                        let (_, validator) =
                            validators.iter().find(|(n, _)| *n == call.name).expect("an offered function");
                        assert!(!named || call.name == "get_weather");
                        let arguments: Value = serde_json::from_str(&call.arguments).unwrap();
                        assert!(validator.is_valid(&arguments), "{format:?}: {arguments} from {text:?}");
                    }
                }
                assert!(complete >= 6, "{format:?} named={named} parallel={parallel}: {complete} of 12 ended");
            }
        }
    }

    fn strict_auto(format: ToolFormat, template: &str) -> ForcedCalls {
        let functions = functions();
        let all: Vec<&Function> = functions.iter().collect();
        let grammar = strict_auto_calls(format, template, &all, true, &special).expect("a grammar here").unwrap();
        ForcedCalls { grammar, arguments_after: None }
    }

    /// `--strict-tools`: text as the model likes, but a call it opens completes to a valid one.
    #[test]
    fn strict_auto_calls_let_text_through_and_hold_started_calls() {
        let cases = [
            (
                ToolFormat::Hermes,
                HERMES,
                "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>",
                "<tool_call>\n{\"name\": \"get_news\"",
            ),
            (ToolFormat::Mistral, MISTRAL_V11, "[TOOL_CALLS]get_time[ARGS]{\"zone\": \"UTC\"}", "[TOOL_CALLS]get_news"),
            (
                ToolFormat::Mistral,
                MISTRAL_V3,
                "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}]",
                "[TOOL_CALLS]Sorry",
            ),
            (
                ToolFormat::QwenXml,
                QWEN_XML,
                "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>",
                "<tool_call>\n<function=get_news>",
            ),
        ];
        for (format, template, call, bad) in cases {
            let auto = strict_auto(format, template);
            assert!(accepts(&auto, "It is sunny, <b>no</b> tool needed."), "{format:?}");
            assert!(accepts(&auto, ""), "{format:?}: an empty answer");
            assert!(accepts(&auto, &format!("Let me look.\n{call}")), "{format:?}");
            assert!(!accepts(&auto, &format!("Let me look.\n{bad}")), "{format:?}: {bad}");
            assert!(!accepts(&auto, &format!("{call} and more text")), "{format:?}: text after the calls");
        }
        let mut rng = Rng::seeded(9);
        let mut calls = 0;
        for (format, template) in formats().into_iter().filter(|(f, _)| *f != ToolFormat::LlamaJson) {
            let auto = strict_auto(format, template);
            for _ in 0..12 {
                let Some(text) = walk(&auto, &mut rng) else { continue };
                let mut parser = ToolCallParser::new(format).with_schemas(parameter_schemas(&tools()));
                let mut pieces = parser.push(&text);
                pieces.extend(parser.finish());
                for piece in pieces {
                    if let Piece::Call(call) = piece {
                        calls += 1;
                        assert!(["get_weather", "get_time"].contains(&call.name.as_str()), "{text:?}");
                        serde_json::from_str::<Value>(&call.arguments).expect("JSON arguments");
                    }
                }
            }
        }
        assert!(calls > 0, "no random answer opened a call");
        assert!(strict_auto_calls(ToolFormat::LlamaJson, LLAMA, &[], true, &special).is_none());
    }

    #[test]
    fn formats_without_a_grammar_here_fall_back_to_json() {
        let functions = functions();
        for format in [ToolFormat::Harmony, ToolFormat::Gemma4, ToolFormat::Pythonic] {
            assert!(forced_calls(format, "", &[&functions[0]], true, false, &special).is_none());
        }
    }
}
