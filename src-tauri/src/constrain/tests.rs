use std::sync::{Arc, OnceLock};

use serde_json::{json, Value};

use super::{Grammar, TokenConstraint, Vocabulary};
use crate::sampling::Rng;

/// A vocabulary of the 256 bytes (id = byte) and an end token (256): walks byte by byte.
fn bytes_vocabulary() -> Arc<Vocabulary> {
    static VOCABULARY: OnceLock<Arc<Vocabulary>> = OnceLock::new();
    VOCABULARY.get_or_init(|| Arc::new(Vocabulary::of_bytes(&[]))).clone()
}

/// A grammar's constraint over [`bytes_vocabulary`], read in bytes: a byte is accepted when
/// the sampler could pick it (it is in the mask).
struct Matcher(TokenConstraint);

impl Matcher {
    fn new(grammar: Arc<Grammar>) -> Matcher {
        Matcher(TokenConstraint::new(&grammar, bytes_vocabulary()).expect("compiles"))
    }

    fn allowed(&mut self) -> Vec<bool> {
        let mut logits = vec![0.0; 257];
        self.0.mask(&mut logits);
        logits.iter().map(|l| *l > f32::NEG_INFINITY).collect()
    }

    fn advance(&mut self, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.allowed()[b as usize] && self.0.advance(b as u32))
    }

    fn accepts(&mut self, bytes: &[u8]) -> bool {
        match bytes {
            [b] => self.allowed()[*b as usize],
            _ => unimplemented!("one byte at a time"),
        }
    }

    fn is_complete(&mut self) -> bool {
        self.0.is_complete() && self.allowed()[256]
    }
}

fn matcher(schema: &Value) -> Matcher {
    Matcher::new(Arc::new(Grammar::from_schema(schema).expect("schema compiles")))
}

/// Whether `text` is a complete document of `schema`.
fn matches(schema: &Value, text: &str) -> bool {
    let mut m = matcher(schema);
    m.advance(text.as_bytes()) && m.is_complete()
}

/// Whether `text` can still become one.
fn prefix_ok(schema: &Value, text: &str) -> bool {
    matcher(schema).advance(text.as_bytes())
}

#[test]
fn any_object_accepts_json_objects_only() {
    let m = || Matcher::new(Arc::new(Grammar::any_object()));
    for text in [r#"{}"#, r#"{"a": [1, 2.5e3, -0.1, true, null, {"b": "c\n\u00e9"}]}"#, "{\n  \"x\": \"é ✓\"\n}"] {
        let mut matcher = m();
        assert!(matcher.advance(text.as_bytes()) && matcher.is_complete(), "{text}");
    }
    for text in [
        "[1]",
        "\"s\"",
        "{\"a\" 1}",
        "{\"a\": 01}",
        "{\"a\": 1,}",
        "{'a': 1}",
        "{\"a\": tru}",
        "{\"a\":\"\x01\"}",
        "{} x",
    ] {
        let mut matcher = m();
        assert!(!(matcher.advance(text.as_bytes()) && matcher.is_complete()), "{text:?} accepted");
    }
}

#[test]
fn properties_in_order_required_ones_present() {
    let schema = json!({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
                        "required": ["name", "age"]});
    assert!(matches(&schema, r#"{"name": "Ann", "age": 41}"#));
    assert!(matches(&schema, r#"{"name":"Ann","age":41,"tags":["a","b"]}"#));
    assert!(!matches(&schema, r#"{"name": "Ann"}"#), "age is required");
    assert!(!prefix_ok(&schema, r#"{"age": 41"#), "name must come first");
    assert!(!prefix_ok(&schema, r#"{"name": "Ann", "other""#), "no other keys");
    assert!(!prefix_ok(&schema, r#"{"name": 3"#), "name is a string");
    assert!(!prefix_ok(&schema, r#"{"name": "A", "age": 4.5"#), "age is an integer");
    assert!(!prefix_ok(&schema, r#"{"name": "A", "age": 4, "tags": ["a",]"#));
}

#[test]
fn optional_properties_may_be_skipped_but_not_reordered() {
    let schema = json!({"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}}, "required": ["c"]});
    assert!(matches(&schema, r#"{"c": 1}"#));
    assert!(matches(&schema, r#"{"a": 1, "c": 3}"#));
    assert!(matches(&schema, r#"{"b": 2, "c": 3}"#));
    assert!(!prefix_ok(&schema, r#"{"c": 3, "a""#));
    assert!(!matches(&schema, r#"{"a": 1}"#));
}

#[test]
fn enums_consts_unions_and_nullable() {
    let schema = json!({"type": "object", "properties": {
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "v": {"const": {"k": [1, 2]}},
        "x": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]},
        "y": {"type": ["boolean", "null"]},
        "z": {"type": "string", "nullable": true}},
        "required": ["unit", "v", "x", "y", "z"]});
    assert!(matches(&schema, r#"{"unit": "celsius", "v": {"k":[1,2]}, "x": 12, "y": null, "z": null}"#));
    assert!(matches(&schema, r#"{"unit": "fahrenheit", "v": {"k":[1,2]}, "x": "ab", "y": true, "z": "s"}"#));
    assert!(!prefix_ok(&schema, r#"{"unit": "kelvin""#));
    assert!(!prefix_ok(&schema, r#"{"unit": "celsius", "v": {"k":[1,3]"#));
    assert!(!prefix_ok(&schema, r#"{"unit": "celsius", "v": {"k":[1,2]}, "x": "abc""#));
}

#[test]
fn numbers_have_bounded_digits() {
    let schema = json!({"type": "number"});
    assert!(matches(&schema, "1234567890123456") && matches(&schema, "-0.1234567890123456e-12"));
    assert!(
        !prefix_ok(&schema, "12345678901234567")
            && !prefix_ok(&schema, "0.12345678901234567")
            && !prefix_ok(&schema, "1e123")
    );
}

#[test]
fn integer_bounds_hold() {
    let schema = json!({"type": "integer", "minimum": 5, "maximum": 120});
    for ok in ["5", "7", "99", "120"] {
        assert!(matches(&schema, ok), "{ok}");
    }
    for bad in ["4", "0", "-1", "121", "1000", "05"] {
        assert!(!matches(&schema, bad), "{bad}");
    }
    assert!(!prefix_ok(&schema, "130"), "too big already");
    assert!(!prefix_ok(&schema, "0"), "0 < 5 and cannot grow");
    assert!(prefix_ok(&schema, "1") && !matches(&schema, "1"), "1 may become 10..120");
    let negative = json!({"type": "integer", "exclusiveMaximum": -2, "minimum": -30});
    assert!(matches(&negative, "-3") && matches(&negative, "-30"));
    assert!(!matches(&negative, "-2") && !matches(&negative, "-31") && !matches(&negative, "3"));
}

#[test]
fn string_lengths_count_characters() {
    let schema = json!({"type": "string", "minLength": 2, "maxLength": 3});
    assert!(matches(&schema, r#""ab""#) && matches(&schema, r#""é✓x""#) && matches(&schema, r#""a\nb""#));
    assert!(!matches(&schema, r#""a""#) && !matches(&schema, r#""abcd""#) && !matches(&schema, r#""\u00e9abc""#));
    assert!(prefix_ok(&schema, "\"\u{e9}") && !matcher(&schema).advance(b"\"\xa9"), "a lone continuation byte");
    assert!(!matcher(&schema).advance(b"\"\xc3a"), "a lead byte without its continuation");
}

#[test]
fn arrays_with_bounds_and_tuples() {
    let schema = json!({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2});
    assert!(matches(&schema, "[1]") && matches(&schema, "[1, 2]"));
    assert!(!matches(&schema, "[]") && !matches(&schema, "[1,2,3]"));
    let tuple = json!({"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": false});
    assert!(matches(&tuple, r#"["a", true]"#) && matches(&tuple, r#"["a"]"#));
    assert!(!matches(&tuple, r#"["a", true, 1]"#) && !matches(&tuple, "[true]"));
}

#[test]
fn recursive_refs() {
    let schema = json!({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}},
                        "$ref": "#/$defs/node"});
    assert!(matches(&schema, r#"{"v": 1, "children": [{"v": 2}, {"v": 3, "children": []}]}"#));
    assert!(!prefix_ok(&schema, r#"{"v": 1, "children": [{"w""#));
}

#[test]
fn whitespace_is_bounded() {
    let schema = json!({"type": "object"});
    assert!(matches(&schema, "{\n  \"a\": [1,\n 2 ]\n}"));
    assert!(!prefix_ok(&schema, "{\"a\" :"), "no space before a colon");
    assert!(!prefix_ok(&schema, "{\"a\": 1 ,") && !prefix_ok(&schema, "[1\n,"), "nor before a comma");
    let required = json!({"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]});
    assert!(
        !prefix_ok(&required, "{\"a\": 1 "),
        "whitespace there would lead nowhere: no comma after it, no closing yet"
    );
    assert!(!prefix_ok(&json!({"type": "array", "minItems": 2}), "[1 "));
    let many = format!("{{{}", " ".repeat(25));
    assert!(!prefix_ok(&schema, &many), "a run of 25 spaces is refused");
    assert!(
        prefix_ok(&schema, "{\r\n\t\t") && !prefix_ok(&schema, "{\n\n") && !prefix_ok(&schema, "{\n \r"),
        "one line break per run"
    );
    assert!(!matches(&schema, "{} ") && !prefix_ok(&schema, " "), "none around the document");
}

#[test]
fn unsupported_or_broken_schemas_are_refused_with_reasons() {
    for (schema, expect) in [
        (json!({"not": {"type": "string"}}), "Unimplemented keys: [\"not\"]"),
        (json!({"type": "array", "uniqueItems": true}), "uniqueItems"),
        (json!({"type": "array", "items": {"enum": [1, 2, 3, 4, 5, 6]}, "uniqueItems": true}), "uniqueItems"),
        (json!({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}), "Unimplemented keys"),
        (json!({"$ref": "https://example.com/s.json"}), "https://example.com/s.json"),
        (json!({"$ref": "#/$defs/missing"}), "/$defs/missing"),
        (json!({"type": "strin"}), "strin"),
        (json!({"properties": {"a": {}}, "required": ["b"]}), "\"b\""),
        (json!({"type": "string", "pattern": "(?=a)"}), "look-around"),
        (json!({"type": "string", "minLength": 5, "maxLength": 2}), "Unsatisfiable"),
        (json!(false), "matches nothing"),
        (json!({"type": "integer", "minimum": 5, "maximum": 4}), "minimum (5) is greater than maximum (4)"),
        (json!("object"), "must be an object"),
        (json!({"$ref": "#"}), "itself"),
        (json!({"anyOf": [{"$ref": "#"}, {"type": "string"}]}), "loop"),
        (json!({"anyOf": [{"$ref": "#"}, {"$ref": "#/anyOf/0"}]}), "loop"),
        (
            json!({"$defs": {"a": {"oneOf": [{"$ref": "#/$defs/b"}]}, "b": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"}),
            "loop",
        ),
    ] {
        let err = Grammar::from_schema(&schema).expect_err(&schema.to_string()).to_string();
        assert!(err.contains(expect), "{schema}: {err}");
    }
}

/// Random documents walked byte by byte through the matcher (any byte it allows, from an
/// alphabet that covers JSON) are complete, parse, and validate against the schema.
#[test]
fn random_walks_produce_valid_documents() {
    let schemas = [
        json!({"type": "object"}),
        json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 5}, "n": {"type": "integer", "minimum": -3, "maximum": 250},
               "kind": {"enum": ["a", "b", 3, null]}, "list": {"type": "array", "items": {"type": "number"}, "maxItems": 3},
               "opt": {"type": ["string", "null"]}}, "required": ["name", "n", "kind"]}),
        json!({"type": "array", "items": {"anyOf": [{"type": "boolean"}, {"type": "object", "properties": {"x": {"type": "integer", "exclusiveMinimum": 10}}, "required": ["x"]}]}, "minItems": 2}),
    ];
    let alphabet: Vec<u8> = b"{}[]\":,0123456789-.eE+ \nabcdefghijklmnopqrstuvwxyz\\/\xc3\xa9".to_vec();
    let mut rng = Rng::seeded(11);
    for schema in &schemas {
        let validator = jsonschema::validator_for(schema).expect("valid schema");
        let grammar = Arc::new(if schema == &json!({"type": "object"}) {
            Grammar::any_object()
        } else {
            Grammar::from_schema(schema).unwrap()
        });
        let mut produced = 0;
        for _ in 0..300 {
            let Some(text) = random_walk(&grammar, &alphabet, &mut rng, 0.3) else { continue };
            produced += 1;
            let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?} does not parse: {e}"));
            assert!(validator.is_valid(&value), "{text} does not validate against {schema}");
        }
        assert!(produced > 20, "only {produced} complete documents for {schema}");
    }
}

#[test]
fn patterns_formats_multiples_and_number_bounds() {
    let code = json!({"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"});
    assert!(matches(&code, r#""ABC-12""#) && !prefix_ok(&code, r#""AB1"#) && !matches(&code, r#""ABC-123""#));
    let when = json!({"type": "string", "format": "date-time"});
    assert!(matches(&when, r#""2026-12-02T08:15:00Z""#) && matches(&when, r#""2026-02-28T23:59:59.5+01:00""#));
    assert!(!prefix_ok(&when, r#""[{}]"#) && !matches(&when, r#""2026-13-01T00:00:00Z""#));
    let day = json!({"type": "string", "format": "date"});
    assert!(matches(&day, r#""2024-02-29""#) && matches(&day, r#""2000-02-29""#) && matches(&day, r#""2026-04-30""#));
    assert!(
        !matches(&day, r#""2025-02-29""#) && !matches(&day, r#""1900-02-29""#) && !matches(&day, r#""2026-04-31""#)
    );
    let email = json!({"type": "string", "format": "email"});
    assert!(matches(&email, r#""ann@example.com""#) && !matches(&email, r#""ann""#));
    let uuid = json!({"type": "string", "format": "uuid"});
    assert!(matches(&uuid, r#""123e4567-e89b-12d3-a456-426614174000""#) && !matches(&uuid, r#""123e4567""#));
    let even = json!({"type": "integer", "multipleOf": 2, "minimum": 0, "maximum": 10});
    assert!(matches(&even, "4") && !matches(&even, "5") && !matches(&even, "12"));
    let ratio = json!({"type": "number", "minimum": 0, "exclusiveMaximum": 1});
    assert!(matches(&ratio, "0") && matches(&ratio, "0.25") && !matches(&ratio, "1") && !prefix_ok(&ratio, "-"));
    let price = json!({"type": "number", "multipleOf": 0.01});
    assert!(matches(&price, "12.34") && !matches(&price, "12.345"));
    // Distinct items where they are few values (pydantic's `set[Literal[...]]`).
    let set = json!({"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": true, "minItems": 1});
    assert!(matches(&set, r#"["b", "a"]"#) && matches(&set, r#"["c","a","b"]"#) && matches(&set, r#"["a"]"#));
    assert!(!prefix_ok(&set, r#"["a", "a""#) && !matches(&set, "[]") && !prefix_ok(&set, r#"["d""#));
    assert!(matches(&json!({"type": "array", "items": {"type": "boolean"}, "uniqueItems": true}), "[false, true]"));
    // A format nothing enforces is an annotation; `nullable` (OpenAPI) allows null.
    assert!(matches(&json!({"type": "string", "format": "password"}), r#""x""#));
    assert!(matches(&json!({"type": "integer", "nullable": true}), "null"));
    // Objects with properties take no other keys; `\u` escapes of any character.
    let closed = json!({"type": "object", "properties": {"a": {"type": "string"}}});
    assert!(matches(&closed, r#"{"a": "\u00e9\n"}"#) && !prefix_ok(&closed, r#"{"b""#));
    let open = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": true});
    assert!(matches(&open, r#"{"a": 1, "b": [true]}"#));
}

/// Random walks (as [`random_walks_produce_valid_documents`]) through schemas with the keywords
/// the hand-written matcher refused: every complete document validates, formats included.
#[test]
fn random_walks_honour_patterns_formats_and_multiples() {
    let schemas = [
        json!({"type": "object", "properties": {
            "code": {"type": "string", "pattern": "^[a-c]{2}[0-9]$"},
            "when": {"type": "string", "format": "date"},
            "id": {"type": "string", "format": "uuid"},
            "even": {"type": "integer", "multipleOf": 4, "maximum": 100},
            "ratio": {"type": "number", "minimum": -1.5, "maximum": 2.5}},
            "required": ["code", "when", "even", "ratio"]}),
        json!({"$defs": {"tree": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
               "kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}, "maxItems": 2}}, "required": ["n"]}},
               "$ref": "#/$defs/tree"}),
        json!({"type": "array", "items": {"type": "string", "format": "email", "maxLength": 12}, "minItems": 1, "maxItems": 2}),
    ];
    let alphabet: Vec<u8> = b"{}[]\":,0123456789-.eE+ \nabcdefghijklmnopqrstuvwxyzT@".to_vec();
    let mut rng = Rng::seeded(23);
    for schema in &schemas {
        let validator = jsonschema::options().should_validate_formats(true).build(schema).expect("valid schema");
        let grammar = Arc::new(Grammar::from_schema(schema).unwrap());
        let mut produced = 0;
        for _ in 0..150 {
            let Some(text) = random_walk(&grammar, &alphabet, &mut rng, 1.0) else { continue };
            produced += 1;
            let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?} does not parse: {e}"));
            assert!(validator.is_valid(&value), "{text} does not validate against {schema}");
        }
        assert!(produced > 20, "only {produced} complete documents for {schema}");
    }
}

/// A document walked at random through the grammar, byte by byte from `alphabet` (any byte it
/// allows; closing brackets and quotes pulled a quarter of the time so that documents end),
/// ended with chance `stop` at each point where it is complete; `None` if it is not complete
/// after 400 bytes. A point where no byte may come must be the document's end: no dead ends.
fn random_walk(grammar: &Arc<Grammar>, alphabet: &[u8], rng: &mut Rng, stop: f64) -> Option<String> {
    let mut m = Matcher::new(grammar.clone());
    let mut text = Vec::new();
    for _ in 0..400 {
        if m.is_complete() && rng.next_f64() < stop {
            break;
        }
        let options: Vec<u8> = alphabet.iter().copied().filter(|b| m.accepts(&[*b])).collect();
        if options.is_empty() {
            assert!(m.is_complete(), "dead end after {:?}", String::from_utf8_lossy(&text));
            break;
        }
        let closing: Vec<u8> = options.iter().copied().filter(|b| b"}]\"".contains(b)).collect();
        let pool = if !closing.is_empty() && rng.next_f64() < 0.25 { &closing } else { &options };
        let b = pool[(rng.next_u64() % pool.len() as u64) as usize];
        assert!(m.advance(&[b]));
        text.push(b);
    }
    m.is_complete().then(|| String::from_utf8(text).expect("strings hold whole UTF-8 characters"))
}
