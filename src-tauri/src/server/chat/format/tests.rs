//! What holds for every format: each template is recognised as its family's, and the grammars of
//! forced and strict calls allow what the models write and nothing their own reader would not
//! read as calls of the offered functions (random walks through each grammar). The helpers at
//! the top serve each format's own tests.

use std::sync::Arc;

use serde_json::{json, Value};

use super::{parameter_schemas, CallSpec, ChatFormat, ForcedCalls, Function, ModelFormat, DETECT};
use crate::constrain::{TokenConstraint, Vocabulary};
use crate::sampling::Rng;
use crate::server::chat::piece::{Piece, ToolCall};

/// What `format`'s reader makes of `pieces` (no tool schemas), adjacent texts merged.
pub(super) fn read(format: &dyn ChatFormat, pieces: &[&str]) -> Vec<Piece> {
    let mut reader = format.reader(Default::default());
    let mut out: Vec<Piece> = pieces.iter().flat_map(|t| reader.push(t)).collect();
    out.extend(reader.finish());
    let mut merged: Vec<Piece> = Vec::new();
    for piece in out {
        match (merged.last_mut(), piece) {
            (Some(Piece::Text(a)), Piece::Text(b)) => a.push_str(&b),
            (_, piece) => merged.push(piece),
        }
    }
    merged
}

pub(super) fn call(name: &str, arguments: &str) -> Piece {
    Piece::Call(ToolCall { name: name.into(), arguments: arguments.into() })
}

/// The format a template is recognised as.
fn format_of(template: &str) -> Box<dyn ChatFormat> {
    DETECT.iter().find_map(|detect| detect(template)).expect("a format")
}

#[test]
fn formats_from_templates() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat_templates");
    let of = |f: &str| ModelFormat::of_template(&std::fs::read_to_string(dir.join(f)).unwrap()).name();
    assert_eq!(of("qwen2.5.jinja"), "hermes");
    assert_eq!(of("qwen3.jinja"), "hermes");
    assert_eq!(of("llama3.1.jinja"), "llama-json");
    assert_eq!(of("mistral-v0.3.jinja"), "mistral-v3");
    assert_eq!(of("smollm2.jinja"), "plain");
    assert_eq!(of("gemma4.jinja"), "gemma4");
    assert_eq!(of("lfm2.jinja"), "pythonic");
    assert_eq!(of("glm-4.6.jinja"), "glm");
    assert_eq!(of("minimax-m2.jinja"), "minimax");
    assert_eq!(of("deepseek-v3.1.jinja"), "deepseek");
    assert_eq!(of("kimi-k2.jinja"), "kimi");
    assert_eq!(of("seed-oss.jinja"), "seed-xml");
    assert_eq!(of("smollm3.jinja"), "hermes");
    assert_eq!(of("nemotron-nano-v2.jinja"), "nemotron");
    assert_eq!(of("nemotron-3-nano.jinja"), "qwen-xml");
    assert_eq!(of("granite-4.0.jinja"), "hermes");
    for qwen3_5 in ["qwen3.5.jinja", "qwen3.6.jinja", "qwen3-coder.jinja"] {
        assert_eq!(of(qwen3_5), "qwen-xml", "{qwen3_5}");
    }
    for next in ["qwen3-next-instruct.jinja", "qwen3-next-thinking.jinja"] {
        assert_eq!(of(next), "hermes", "{next}");
    }
    let harmony = ModelFormat::of_template("{{ '<|channel|>analysis<|message|>' }}{{ '</think>' }}");
    assert_eq!(harmony.name(), "harmony");
    assert!(harmony.reasoning("").is_none(), "Harmony's reader splits the reasoning itself");
    assert!(ModelFormat::of_template(&std::fs::read_to_string(dir.join("qwen3.jinja")).unwrap())
        .reasoning("")
        .is_some());
    assert!(!ModelFormat::plain().writes_calls());
}

/// A template that renders no `tool_calls` sees earlier calls in its turn's text: as the JSON
/// list, or in the format's own syntax where it has one (LFM2).
#[test]
fn earlier_calls_go_back_into_the_history() {
    let messages = || {
        vec![
            json!({"role": "user", "content": "weather?"}),
            json!({"role": "assistant", "content": "Checking.", "tool_calls": [{"function": {"name": "w", "arguments": {"city": "Oslo"}}}]}),
        ]
    };
    let plain = ModelFormat::of_template("{{ messages }}").history(messages());
    assert_eq!(plain[1]["content"], "Checking.\n[{\"name\":\"w\",\"arguments\":{\"city\":\"Oslo\"}}]");
    assert!(plain[1].get("tool_calls").is_none());
    let lfm2 = ModelFormat::of_template("<|tool_list_start|>").history(messages());
    assert_eq!(lfm2[1]["content"], "Checking.<|tool_call_start|>[w(city=\"Oslo\")]<|tool_call_end|>");
    let renders = ModelFormat::of_template("<tool_call>{{ m.tool_calls }}").history(messages());
    assert_eq!(renders[1]["content"], "Checking.", "a template that renders calls gets them as they are");
}

const SPECIAL: [&str; 10] = [
    "[TOOL_CALLS]",
    "[ARGS]",
    "<|python_tag|>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
];
const HERMES: &str = "{% if tools %}<tool_call>{% endif %}";
const MISTRAL_V11: &str = "[TOOL_CALLS]{{ name }}[ARGS]";
const MISTRAL_V3: &str = "{{- \"[TOOL_CALLS] [\" }}";
const LLAMA: &str = "\"parameters\"";
const QWEN_XML: &str = "<function=x><parameter=y>";
const GLM: &str = "<tool_call>{{ name }}<arg_key>";
const MINIMAX: &str = "<minimax:tool_call><invoke name=";
const DEEPSEEK: &str = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>";
const KIMI: &str = "<|tool_calls_section_begin|>";
const SEED: &str = "<seed:tool_call><function=x><parameter=y>";
const NEMOTRON: &str = "<AVAILABLE_TOOLS>{{ tools }}<TOOLCALL>";

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

fn spec<'a>(functions: &'a [&'a Function], named: bool, parallel: bool) -> CallSpec<'a> {
    CallSpec { functions, named, parallel, special: &special }
}

fn grammar(template: &str, named: bool, parallel: bool) -> ForcedCalls {
    let functions = functions();
    let chosen: Vec<&Function> = if named { vec![&functions[0]] } else { functions.iter().collect() };
    format_of(template).forced_calls(&spec(&chosen, named, parallel)).expect("a grammar here").unwrap()
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

/// An answer drawn at random from the grammar (masks over the whole vocabulary, a pull towards
/// closing brackets so that answers end).
fn walk(forced: &ForcedCalls, rng: &mut Rng) -> Option<String> {
    let mut c = TokenConstraint::new(&forced.grammar, vocabulary()).unwrap();
    let mut out = Vec::new();
    for _ in 0..600 {
        let mut logits = vec![0.0f32; 256 + SPECIAL.len() + 1];
        for b in b"}]\">\n" {
            logits[*b as usize] = 1.0;
        }
        assert!(c.mask(&mut logits) > 0, "a dead end after {:?}", String::from_utf8_lossy(&out));
        let allowed: Vec<u32> = (0..logits.len() as u32).filter(|&t| logits[t as usize] > f32::NEG_INFINITY).collect();
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

/// The calls `template`'s format reads in `text` (text beside them fails the test).
fn parse(template: &str, text: &str) -> Vec<ToolCall> {
    let format = format_of(template);
    let mut reader = format.reader(parameter_schemas(&tools()));
    let mut pieces = reader.push(text);
    pieces.extend(reader.finish());
    pieces
        .into_iter()
        .map(|p| match p {
            Piece::Call(call) => call,
            other => panic!("{}: {other:?} beside the calls in {text:?}", format.name()),
        })
        .collect()
}

const TEMPLATES: [&str; 11] =
    [HERMES, MISTRAL_V11, MISTRAL_V3, LLAMA, QWEN_XML, GLM, MINIMAX, DEEPSEEK, KIMI, SEED, NEMOTRON];

#[test]
fn the_calls_models_write_are_what_the_grammars_allow() {
    let natural = [
        (HERMES, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>"),
        (MISTRAL_V11, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"days\": 3}"),
        (MISTRAL_V3, "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}]"),
        (MISTRAL_V3, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}, \"id\": \"a1B2c3D4e\"}]"),
        (LLAMA, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 3}}"),
        (QWEN_XML, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"),
        (QWEN_XML, "<tool_call><function=get_weather><parameter=city>Paris</parameter><parameter=days>3</parameter></function></tool_call>"),
        (GLM, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"),
        (MINIMAX, "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n<parameter name=\"days\">3</parameter>\n</invoke>\n</minimax:tool_call>"),
        (DEEPSEEK, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\", \"days\": 3}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
        (KIMI, "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\", \"days\": 3}<|tool_call_end|><|tool_calls_section_end|>"),
        (SEED, "<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n<parameter=days>3</parameter>\n</function>\n</seed:tool_call>"),
        (NEMOTRON, "<TOOLCALL>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}]</TOOLCALL>"),
    ];
    for (template, text) in natural {
        // A named call's text around its arguments is fixed (Mistral's: no `"id"`).
        let named_too = !text.contains("\"id\"");
        for named in [true, false].into_iter().filter(|&n| named_too || !n) {
            assert!(accepts(&grammar(template, named, true), text), "{template} named={named}: {text}");
        }
        let calls = parse(template, text);
        assert_eq!(calls.len(), 1, "{template}");
        assert_eq!(serde_json::from_str::<Value>(&calls[0].arguments).unwrap(), json!({"city": "Paris", "days": 3}));
        // Not an answer: a function that is not offered, or plain text.
        let other = text.replace("get_weather", "get_news");
        assert!(!accepts(&grammar(template, false, true), &other), "{template}: {other}");
        assert!(!accepts(&grammar(template, false, true), "It is sunny."), "{template}");
    }
}

#[test]
fn xml_string_values_are_any_text_up_to_the_closing_tag() {
    let run = Function {
        name: "run".into(),
        parameters: json!({"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}),
    };
    let forced = format_of(QWEN_XML).forced_calls(&spec(&[&run], true, false)).unwrap().unwrap();
    let code = "if a < b:\n    print(\"</p> <parameter=x>\")";
    let text =
        format!("<tool_call>\n<function=run>\n<parameter=code>\n{code}\n</parameter>\n</function>\n</tool_call>");
    assert!(accepts(&forced, &text), "{text}");
    let pieces = read(format_of(QWEN_XML).as_ref(), &[&text]);
    let [Piece::Call(call)] = pieces.as_slice() else { panic!("not one call: {pieces:?}") };
    assert_eq!(serde_json::from_str::<Value>(&call.arguments).unwrap(), json!({"code": code}));
    let twice = text.replace("</parameter>\n</function>", "</parameter></parameter>\n</function>");
    assert!(!accepts(&forced, &twice), "the value ends at the first closing tag");
}

#[test]
fn a_named_calls_json_arguments_follow_a_known_key() {
    for template in TEMPLATES {
        let forced = grammar(template, true, false);
        let Some(key) = &forced.arguments_after else {
            assert!(
                [QWEN_XML, GLM, MINIMAX, SEED].contains(&template),
                "only the tagged formats' arguments are not JSON"
            );
            continue;
        };
        let known = ["\"arguments\"", "\"parameters\"", "[ARGS]", "<｜tool▁sep｜>", "<|tool_call_argument_begin|>"];
        assert!(known.contains(&key.as_str()), "{template}: {key}");
    }
}

/// Random answers of each format's grammar read back, with the format's own reader, as calls of
/// the offered functions whose arguments validate against their schemas.
#[test]
fn random_answers_parse_as_valid_calls() {
    let validators: Vec<(String, jsonschema::Validator)> =
        functions().iter().map(|f| (f.name.clone(), jsonschema::validator_for(&f.parameters).unwrap())).collect();
    let mut rng = Rng::seeded(5);
    for template in TEMPLATES {
        for (named, parallel) in [(true, false), (false, false), (false, true)] {
            let forced = grammar(template, named, parallel);
            let mut complete = 0;
            for _ in 0..12 {
                let Some(text) = walk(&forced, &mut rng) else { continue };
                complete += 1;
                let calls = parse(template, &text);
                assert!(!calls.is_empty() && (parallel || calls.len() == 1), "{template}: {text:?}");
                for call in calls {
                    let (_, validator) = validators.iter().find(|(n, _)| *n == call.name).expect("an offered function");
                    assert!(!named || call.name == "get_weather");
                    let arguments: Value = serde_json::from_str(&call.arguments).unwrap();
                    assert!(validator.is_valid(&arguments), "{template}: {arguments} from {text:?}");
                }
            }
            assert!(complete >= 6, "{template} named={named} parallel={parallel}: {complete} of 12 ended");
        }
    }
}

fn strict_auto(template: &str) -> ForcedCalls {
    let functions = functions();
    let all: Vec<&Function> = functions.iter().collect();
    let grammar = format_of(template).strict_calls(&spec(&all, false, true)).expect("a grammar here").unwrap();
    ForcedCalls { grammar, arguments_after: None }
}

/// `--strict-tools`: text as the model likes, but a call it opens completes to a valid one.
#[test]
fn strict_auto_calls_let_text_through_and_hold_started_calls() {
    let cases = [
        (
            HERMES,
            "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"get_news\"",
        ),
        (MISTRAL_V11, "[TOOL_CALLS]get_time[ARGS]{\"zone\": \"UTC\"}", "[TOOL_CALLS]get_news"),
        (MISTRAL_V3, "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}]", "[TOOL_CALLS]Sorry"),
        (
            QWEN_XML,
            "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=get_news>",
        ),
        (
            GLM,
            "<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>UTC</arg_value>\n</tool_call>",
            "<tool_call>get_news",
        ),
        (
            MINIMAX,
            "<minimax:tool_call>\n<invoke name=\"get_time\">\n<parameter name=\"zone\">UTC</parameter>\n</invoke>\n</minimax:tool_call>",
            "<minimax:tool_call>\n<invoke name=\"get_news\">",
        ),
        (
            DEEPSEEK,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"zone\": \"UTC\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_news",
        ),
        (
            KIMI,
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>{\"zone\": \"UTC\"}<|tool_call_end|><|tool_calls_section_end|>",
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_news",
        ),
        (
            SEED,
            "<seed:tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</seed:tool_call>",
            "<seed:tool_call>\n<function=get_news>",
        ),
        (
            NEMOTRON,
            "<TOOLCALL>[{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}]</TOOLCALL>",
            "<TOOLCALL>[{\"name\": \"get_news\"",
        ),
    ];
    for (template, call, bad) in cases {
        let auto = strict_auto(template);
        assert!(accepts(&auto, "It is sunny, <b>no</b> tool needed."), "{template}");
        assert!(accepts(&auto, ""), "{template}: an empty answer");
        assert!(accepts(&auto, &format!("Let me look.\n{call}")), "{template}");
        assert!(!accepts(&auto, &format!("Let me look.\n{bad}")), "{template}: {bad}");
        assert!(!accepts(&auto, &format!("{call} and more text")), "{template}: text after the calls");
    }
    let mut rng = Rng::seeded(9);
    let mut calls = 0;
    for template in TEMPLATES.into_iter().filter(|t| *t != LLAMA) {
        let auto = strict_auto(template);
        for _ in 0..12 {
            let Some(text) = walk(&auto, &mut rng) else { continue };
            let mut reader = format_of(template).reader(parameter_schemas(&tools()));
            let mut pieces = reader.push(&text);
            pieces.extend(reader.finish());
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
    assert!(format_of(LLAMA).strict_calls(&spec(&[], false, true)).is_none());
}

#[test]
fn formats_without_a_grammar_here_fall_back_to_json() {
    let functions = functions();
    for template in ["<|channel|><|message|>", "<|tool_call><tool_call|>", "<|tool_call_start|>"] {
        let format = format_of(template);
        assert!(format.forced_calls(&spec(&[&functions[0]], true, false)).is_none(), "{}", format.name());
    }
}
